"""Issue 27's grader defects in lessons 11 and 12, each reproduced: an answer a grader accepts
must keep the next cell running, a false accept is refused, a right guess is judged right, and
the common mistakes of 11.one_head and 12.block are named (written to fail before the fix)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smallem.autodiff.operations import softmax
from smallem.course import EXERCISES, grade, reveal, use


def test_a_mask_of_lists_or_integers_is_handed_on_as_booleans(capsys):
    """`~` of what `use` hands on is the upper triangle, as the next cell computes it."""
    upper = ~np.tril(np.ones((6, 6), bool))
    for answer in (lambda T: [[j <= i for j in range(T)] for i in range(T)],
                   lambda T: np.tri(T, dtype=int)):
        mask = use("11.causal_mask", answer)
        assert "✓ 11.causal_mask right" in capsys.readouterr().out
        assert np.array_equal(~mask(6), upper)


def test_a_float32_softmax_rule_is_named_not_accepted():
    def rule32(s, g):
        s, g = np.float32(s), np.float32(g)
        return s * (g - (g * s).sum(axis=-1, keepdims=True))
    verdict = grade("11.softmax_backward", rule32)
    assert not verdict.ok and "float32" in verdict.message


def test_a_block_that_cuts_the_gradient_is_refused():
    verdict = grade("12.block", lambda tape, block, x: tape.constant(block(tape, x).value))
    assert not verdict.ok and "gradient" in verdict.message


def _layer_norm(tape, norm, x, axis=-1):
    """LayerNorm written out on the tape: (x − mean) / √(var + ε) · weight + bias."""
    centred = x - tape.mean(x, axis, keepdim=True)
    var = tape.mean(centred * centred, axis, keepdim=True)
    return centred / tape.power(var + norm.eps, 0.5) * norm.weight.var(tape) + norm.bias.var(tape)


def test_a_block_with_its_layernorm_written_out_is_accepted():
    def block_forward(tape, block, x):
        x = x + block.attention(tape, _layer_norm(tape, block.attention_norm, x))
        return x + block.mlp(tape, _layer_norm(tape, block.mlp_norm, x))
    assert grade("12.block", block_forward).ok


@pytest.mark.parametrize("mistake, words", [
    ("parallel", "parallel"),
    ("mlp first", "MLP first"),
    ("wrong axis", "over the positions"),
])
def test_the_common_block_mistakes_are_named(mistake, words):
    def block_forward(tape, block, x):
        if mistake == "parallel":
            return (x + block.attention(tape, block.attention_norm(tape, x))
                    + block.mlp(tape, block.mlp_norm(tape, x)))
        if mistake == "mlp first":
            x = x + block.mlp(tape, block.mlp_norm(tape, x))
            return x + block.attention(tape, block.attention_norm(tape, x))
        x = x + block.attention(tape, _layer_norm(tape, block.attention_norm, x, axis=-2))
        return x + block.mlp(tape, _layer_norm(tape, block.mlp_norm, x, axis=-2))
    verdict = grade("12.block", block_forward)
    assert not verdict.ok and words in verdict.message, verdict.message


def _head(weights_of):
    def one_head(tape, x, wq, wk, wv):
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = q @ tape.transpose(k) / math.sqrt(wq.shape[1])
        return weights_of(tape, scores) @ v
    return one_head


def _tril(t, k=0):
    return np.tril(np.ones((t, t)), k=k)


@pytest.mark.parametrize("mistake, weights_of, words", [
    ("mask after the softmax",
     lambda tape, s: softmax(tape, s) * tape.constant(_tril(s.shape[-1])), "after the softmax"),
    ("0 instead of -inf",
     lambda tape, s: softmax(tape, s * tape.constant(_tril(s.shape[-1]))), "0 instead of −∞"),
    ("i sees i + 1",
     lambda tape, s: softmax(tape, s + tape.constant(np.where(_tril(s.shape[-1], 1), 0.0, -1e9))),
     "i + 1"),
    ("softmax over the wrong axis",
     lambda tape, s: tape.transpose(softmax(tape, tape.transpose(s) + tape.constant(
         np.where(_tril(s.shape[-1]).T, 0.0, -1e9)))), "wrong axis"),
])
def test_the_common_head_mistakes_are_named(mistake, weights_of, words):
    verdict = grade("11.one_head", _head(weights_of))
    assert not verdict.ok and words in verdict.message, verdict.message


def test_reveal_takes_a_zero_within_the_next_cells_tolerance(capsys):
    reveal(0, 1.665e-16, "the change", factor=10, atol=1e-12)
    assert "Well predicted" in capsys.readouterr().out
    reveal(0, 1.665e-10, "the change", factor=10, atol=1e-12)
    assert "Well predicted" not in capsys.readouterr().out


@pytest.mark.parametrize("guess", [["lower", "higher"], ("Lower", "Higher"), ["LOWER", " higher"]])
def test_reveal_takes_words_in_any_sequence_and_case(capsys, guess):
    reveal(guess, ("lower", "higher"), "(training, held-out)")
    assert "Well predicted" in capsys.readouterr().out
    reveal(guess[::-1], ("lower", "higher"), "(training, held-out)")
    assert "Well predicted" not in capsys.readouterr().out


ALTERNATES = [eid for eid, ex in EXERCISES.items() if ex.alternate_cell]


@pytest.mark.parametrize("lesson", sorted({e[:2] for e in EXERCISES}))
def test_every_exercise_gives_a_second_answer(lesson):
    """Issue 27's rule for every lesson: each exercise has a second right answer in another
    style, which the notebook is run with (tests/test_notebook_solutions.py)."""
    missing = [e for e in EXERCISES if e[:2] == lesson and e not in ALTERNATES]
    assert not missing, f"no alternate_cell for {', '.join(missing)}"


@pytest.mark.parametrize("exercise_id", ALTERNATES)
def test_the_alternate_answer_is_right_and_not_the_solution(exercise_id):
    ex = EXERCISES[exercise_id]
    assert ex.alternate_cell.strip() != ex.solution_cell.strip()
    assert grade(exercise_id, ex.solution(ex.alternate_cell)).ok


# -- the capstone's diagnoses (part one) --------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_case():
    from smallem.course.l13_your_engine.capstone import CONFIG
    from smallem.data import BatchSampler, load_corpus
    from smallem.models import Mlp
    corpus = load_corpus()
    contexts, targets = BatchSampler(corpus.train, 64, context=CONFIG.context, seed=0).next()
    return Mlp(CONFIG, backend="cpu64", seed=0), contexts, targets


def _found(mlp_case, exercise_id, source):
    from smallem.course.l13_your_engine.capstone import SETTINGS
    from smallem.course.l13_your_engine.diagnosis import diagnose
    from smallem.course.l13_your_engine.pieces import your_pieces
    model, contexts, targets = mlp_case
    return [f for f in diagnose(your_pieces({exercise_id: source}), model, contexts, targets, SETTINGS)
            if f.piece.id == exercise_id][0]


def test_an_accumulate_with_plus_equals_is_named_as_aliasing(mlp_case):
    source = ("def accumulate(grads, index, grad):\n    if grads[index] is None:\n"
              "        grads[index] = grad\n    else:\n        grads[index] += grad\n")
    found = _found(mlp_case, "02.accumulate", source)
    assert not found.ok and "+= where a new array is needed" in found.sentence, found.sentence


@pytest.mark.parametrize("name", ["11_attention", "12_transformer", "13_your_engine"])
def test_the_setup_imports_what_the_verdicts_tell_the_learner_to_type(name):
    """Every ✗ verdict says hint('ID'), every introduction progress(): both must be defined."""
    import ast
    from pathlib import Path

    import nbformat
    nb = nbformat.read(Path(__file__).parents[1] / "notebooks" / f"{name}.ipynb", as_version=4)
    imported = {alias.asname or alias.name for c in nb.cells if c.cell_type == "code"
                for node in ast.walk(ast.parse(c.source if "%" not in c.source else ""))
                if isinstance(node, ast.ImportFrom) and node.module.startswith("smallem.course")
                for alias in node.names}
    assert {"hint", "progress"} <= imported


# -- one convention for ε in lesson 6 and the capstone; float32 named in lesson 9 and the race --

EPS_INSIDE = '''
def adamw_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * (m_hat / np.sqrt(v_hat + eps) + weight_decay * p), m, v
'''


@pytest.mark.parametrize("source, right", [(EPS_INSIDE, False),
                                           (EXERCISES["06.adamw_step"].alternate_cell, True)],
                         ids=["eps inside the root", "the alternate"])
def test_lesson_6_and_the_capstone_hold_one_convention_for_eps(mlp_case, source, right):
    """ε beside the root, m̂/(√v̂ + ε), in both: ε inside (√(v̂ + ε)) is refused by lesson 6 with
    a verdict saying where ε goes and why it matters, as the capstone refuses it."""
    verdict = grade("06.adamw_step", EXERCISES["06.adamw_step"].solution(source))
    assert verdict.ok == right == _found(mlp_case, "06.adamw_step", source).ok, verdict.message
    if not right:
        assert "inside the square root" in verdict.message and "small gradients" in verdict.message


def _in_float32(exercise_id):
    """The solution, computing and returning float32 (a learner who converted the inputs)."""
    fn = EXERCISES[exercise_id].solution()

    def in32(*args):
        out = fn(*[a.astype(np.float32) if getattr(a, "dtype", None) == np.float64 else a for a in args])
        return tuple(np.float32(o) for o in out) if isinstance(out, tuple) else np.float32(out)
    return in32


@pytest.mark.parametrize("exercise_id", [e for e in EXERCISES if e.startswith("09.")])
def test_a_float32_rule_of_lesson_9_is_named_not_accepted(exercise_id):
    """The next cells compare lesson 9's answers with the tape's float64 to 1e-9 (byhand.compare),
    as 11's float32 softmax rule is refused."""
    verdict = grade(exercise_id, _in_float32(exercise_id))
    assert not verdict.ok and "float32" in verdict.message, verdict.message


def test_a_float32_tanh_backward_is_named_by_the_capstone(mlp_case):
    """One kept before lesson 9 refused it (2e-9 off): the race names it instead of "diverged"."""
    from smallem.course.l13_your_engine.capstone import race
    source = "def tanh_backward(out, dout):\n    return (dout * (1 - out**2)).astype(np.float32)\n"
    found = _found(mlp_case, "09.tanh_backward", source)
    assert not found.ok and "float32" in found.sentence, found.sentence
    verdict = race({"09.tanh_backward": source}, steps=3, progress_bar=False, log=None).verdict()
    assert "09.tanh_backward" in verdict and "float32" in verdict, verdict
