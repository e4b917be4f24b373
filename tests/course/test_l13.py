"""The capstone's race (smallem.course.l13_your_engine.capstone): every solution makes an engine that agrees
with the package's to float64 rounding; blank pieces are the package's and named; a planted wrong
piece makes the race diverge (or stop) with a sentence that names it."""

import numpy as np
import pytest

from smallem.course import EXERCISES
from smallem.course.common.progress import HOME, record
from smallem.course.l13_your_engine import capstone
from smallem.course.l13_your_engine.pieces import ROLES
from smallem.errors import SmallemError

SOLUTIONS = {i: EXERCISES[i].solution_cell for i in ROLES}
SHORT = {"steps": 60, "eval_every": 20, "progress_bar": False, "log": None}

WRONG = {  # planted wrong pieces, as source text the store would hold
    "02.exp_rule": "def exp_rule(be, grad, out, a):\n    return (2 * grad * out,)\n",
    "06.adamw_step": (
        "def adamw_step(p, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01):\n"
        "    m = beta1 * m + (1 - beta1) * g\n"
        "    v = beta2 * v + (1 - beta2) * g * g\n"
        "    return p - lr * (m / (np.sqrt(v) + eps) + weight_decay * p), m, v\n"),  # no bias correction
    "09.embedding_backward": ("def embedding_backward(tokens, dvectors, vocab):\n"
                              "    d = np.zeros((vocab, dvectors.shape[-1]))\n"
                              "    d[tokens] += dvectors\n    return d\n"),  # buffered: repeats lost
    "02.accumulate": "def accumulate(grads, index, grad):\n    grads[index] = grad\n",
    "08.clip_by_global_norm": ("def clip_by_global_norm(grads, max_norm):\n"
                               "    norm = np.sqrt(sum(np.sum(g * g) for g in grads))\n"
                               "    return [g * max_norm / norm for g in grads]\n"),  # stretches too
}


@pytest.fixture(scope="module")
def corpus():
    from smallem.data import load_corpus
    return load_corpus()


def test_every_solution_makes_an_engine_that_agrees_to_float64_precision(corpus, capsys):
    race = capstone.race(SOLUTIONS, corpus=corpus, progress_bar=False)
    assert race.count == 12 and race.agrees and race.largest_difference < 1e-12
    assert len(race.steps) == 400 and len(race.evaluations) == 8
    assert all(e["weights"] < 1e-11 and abs(e["yours"] - e["package"]) < 1e-12 for e in race.evaluations)
    assert race.yours[-1] < race.yours[0] - 2  # it trained: from ln 257 = 5.55 to below 3.5
    assert race.pieces_line() == "12 of 12 pieces are yours."
    assert race.verdict().startswith("✓ Your engine trained the byte MLP: every piece is yours.")
    assert 0 < race.clipped < 400  # clipping did something, not everything
    assert "step  400: held-out loss" in capsys.readouterr().out


def test_blank_pieces_are_the_package_s_and_said_so(corpus):
    race = capstone.race({}, corpus=corpus, **SHORT)
    assert race.count == 0 and race.agrees
    assert race.verdict().startswith("✓ None of the pieces is yours yet")
    partial = capstone.race({k: v for k, v in SOLUTIONS.items()
                             if k not in ("02.div_rule", "03.mean_rule", "06.adamw_step")},
                            corpus=corpus, **SHORT)
    assert partial.agrees and partial.count == 9
    assert partial.pieces_line() == ("9 of 12 pieces are yours; the package's stand in for 02.div_rule "
                                     "(left blank); 03.mean_rule (left blank); 06.adamw_step (left blank).")
    assert "with 9 of 12 pieces yours" in partial.verdict()


@pytest.mark.parametrize("exercise_id", sorted(WRONG))
def test_a_wrong_piece_makes_the_race_diverge_and_is_named(corpus, exercise_id):
    race = capstone.race({**SOLUTIONS, exercise_id: WRONG[exercise_id]}, corpus=corpus, **SHORT)
    assert not race.agrees and race.largest_difference > 1e-3  # visibly: the third decimal
    verdict = race.verdict()
    assert verdict.startswith("✗ The race diverged") and f"your {exercise_id}" in verdict.lower()


def test_the_exp_rule_is_found_by_finite_differences_on_the_model_s_shapes(corpus):
    race = capstone.race({**SOLUTIONS, "02.exp_rule": WRONG["02.exp_rule"]}, corpus=corpus, **SHORT)
    verdict = race.verdict()
    assert "exp of [32, 257]" in verdict and "where finite differences give" in verdict


def test_a_transposed_linear_backward_stops_the_race_and_is_named(corpus):
    transposed = "def linear_backward(x, W, dy):\n    return dy @ W.T, dy.T @ x, dy.sum(0)\n"
    race = capstone.race({**SOLUTIONS, "09.linear_backward": transposed}, corpus=corpus, **SHORT)
    assert race.stopped and not race.steps and not race.agrees
    assert race.verdict() == ("✗ The race could not run: your 09.linear_backward gives W a gradient of "
                              "shape [257, 128] where W has shape [128, 257], on the model's own shapes "
                              "(matmul of [32, 128], [128, 257]).")


def test_a_source_that_no_longer_runs_is_replaced_and_said_so(corpus):
    race = capstone.race({**SOLUTIONS, "02.div_rule": "def div_rule(be, grad, out, a, b)\n"},
                         corpus=corpus, **SHORT)
    assert race.agrees and race.count == 11
    assert "02.div_rule (could not be rebuilt (SyntaxError" in race.pieces_line()


def test_a_piece_that_raises_stops_the_race_with_one_sentence(corpus):
    raising = "def tanh_backward(out, dout):\n    return dout @ out\n"  # (32, 128) @ (32, 128)
    race = capstone.race({**SOLUTIONS, "09.tanh_backward": raising}, corpus=corpus, **SHORT)
    assert race.stopped and race.verdict().startswith("✗ The race could not run: your 09.tanh_backward "
                                                      "raised ValueError")


def test_a_piece_using_a_name_from_another_cell_is_replaced_and_said_so(corpus):
    uses_helper = "def tanh_backward(out, dout):\n    return dout * helper(out)\n"  # helper: another cell
    race = capstone.race({**SOLUTIONS, "09.tanh_backward": uses_helper}, corpus=corpus, **SHORT)
    assert race.agrees and race.count == 11
    assert ("09.tanh_backward (its source raised NameError (name 'helper' is not defined) here: define "
            "what it uses inside it)" in race.pieces_line())


def test_a_renamed_function_is_found():
    source = "def my_exp(be, grad, out, a):\n    return (grad * out,)\n"
    (piece,) = [p for p in capstone.your_pieces({"02.exp_rule": source}) if p.yours]
    assert piece.fn(None, np.ones(2), np.full(2, 3.0), None)[0].tolist() == [3.0, 3.0]


def test_the_pieces_come_from_the_progress_store(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv(HOME, str(tmp_path))
    for eid, source in SOLUTIONS.items():
        record(eid, True, source)
    record("02.exp_rule", False, None)  # a later wrong try keeps the earned pass
    race = capstone.race(corpus=corpus, **SHORT)
    assert race.count == 12 and race.agrees


def test_an_odd_batch_is_refused_in_one_sentence(corpus):
    with pytest.raises(SmallemError, match="batch must be even"):
        capstone.race({}, corpus=corpus, batch=31, **SHORT)


def test_the_plot_draws_both_curves(corpus):
    import matplotlib
    matplotlib.use("Agg")
    race = capstone.race(SOLUTIONS, corpus=corpus, **SHORT)
    left, right = race.plot()
    assert len(left.lines) == 2 and np.allclose(left.lines[0].get_ydata(), left.lines[1].get_ydata())


DAMAGED = {  # stored pieces that cannot be parts of an engine: what each returns, and the sentence
    "returns 0.0": ("02.exp_rule", "def exp_rule(be, grad, out, a):\n    return 0.0\n",
                    "returned 0.0 (a float) where a tuple of 1 gradient, one per input is needed"),
    "returns None": ("09.linear_backward", "def linear_backward(x, W, dy):\n    return None\n",
                     "returned None where a tuple (dx, dW) is needed"),
    "clips to None": ("08.clip_by_global_norm", "def clip_by_global_norm(grads, max_norm):\n    pass\n",
                      "returned None where a list of gradients, one per parameter is needed"),
    "updates to 0.0": ("06.adamw_step", "def adamw_step(p, g, m, v, t, *settings):\n    return 0.0\n",
                       "returned 0.0 (a float) where a tuple (p, m, v) is needed"),
    "a nan gradient": ("02.exp_rule", "def exp_rule(be, grad, out, a):\n    return (grad * out * np.nan,)\n",
                       "gives a gradient holding nan for a, on the model's own shapes (exp of [32, 257])"),
    "a SyntaxError": ("02.exp_rule", "def exp_rule(be, grad, out, a)\n    return (grad * out,)\n",
                      "could not be rebuilt (SyntaxError"),
    "an inline check": ("02.exp_rule", "check('02.exp_rule', lambda be, grad, out, a: (grad * out,))\n",
                        "could not be rebuilt: it was written inside check(...)"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_piece_is_named_in_one_sentence_and_the_package_s_stands_in(corpus, case):
    exercise_id, source, said = DAMAGED[case]
    race = capstone.race({**SOLUTIONS, exercise_id: source}, corpus=corpus, **SHORT)
    assert race.agrees and race.count == 11 and not race.stopped  # it ran, on the package's piece
    verdict = race.verdict()
    assert verdict.startswith("✓ Your engine trained the byte MLP with 11 of 12 pieces yours")
    assert f"The package's {exercise_id} stood in for yours, which {said}" in verdict, verdict
    assert "\n" not in verdict and said in race.pieces_line()


def test_a_function_checked_inline_is_kept_as_its_lambda_and_rebuilt(corpus, tmp_path, monkeypatch, capsys):
    from smallem.course import answers, check

    monkeypatch.setenv(HOME, str(tmp_path))
    assert check("02.exp_rule", lambda be, grad, out, a: (grad * out,)).ok
    assert answers()["02.exp_rule"] == "lambda be, grad, out, a: (grad * out,)"
    race = capstone.race(corpus=corpus, **SHORT)
    assert race.count == 1 and race.agrees and [p.id for p in race.pieces if p.yours] == ["02.exp_rule"]


@pytest.mark.parametrize("option", [{"steps": 0}, {"steps": -3}, {"eval_every": 0}, {"steps": 2.5}])
def test_a_race_of_no_steps_is_refused_in_one_sentence(corpus, option):
    with pytest.raises(SmallemError, match=f"the race's {next(iter(option))} must be a whole number"):
        capstone.race({}, corpus=corpus, **{**SHORT, **option})


def test_the_corpus_may_be_a_path(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    for k in range(12):  # twelve documents: the split holds some out
        (text / f"doc{k}.txt").write_text(f"document {k}: the quick brown fox jumps over a lazy dog.\n" * 80)
    race = capstone.race({}, corpus=str(text), **SHORT)
    assert race.agrees and len(race.steps) == 60
    with pytest.raises(SmallemError, match="does not exist"):
        capstone.race({}, corpus=str(tmp_path / "missing.txt"), **SHORT)
    with pytest.raises(SmallemError, match="the race's corpus must be a path"):
        capstone.race({}, corpus=3, **SHORT)
