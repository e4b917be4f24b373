"""Lesson 12, the Transformer: its parameter count for any size, and the pre-LN block written
from the model's own pieces, graded against models.Transformer."""

from __future__ import annotations

import numpy as np

from ...autodiff.tape import Tape, Var
from ...data import VOCAB
from ...models.transformer import Transformer, TransformerConfig
from ..common.graders import Wrong, call, compare, number
from ..common.grading import exercise


def _count(norms=True, positions=True, hidden=4):
    """A planted parameter count that forgets one piece."""
    def count(layers, width, context, vocab=VOCAB):
        c = width
        mlp = (c * hidden * c + hidden * c) + (hidden * c * c + c)
        block = (4 * c if norms else 0) + 4 * (c * c + c) + mlp
        return (vocab * c + (context * c if positions else 0) + layers * block + (2 * c if norms else 0)
                + (c * vocab + vocab))
    return count

@exercise("12.parameter_count", title="the Transformer's parameters, for any size",
          hints=("Count by pieces: the two tables first (a row of C numbers per byte, and per "
                 "position), then one block, times the number of blocks, then what comes after.",
                 "A block holds two LayerNorms (a weight and a bias of C each), four C×C maps "
                 "(query, key, value, output) with a bias each, and the MLP C → 4C → C with its "
                 "biases.",
                 "After the blocks: a last LayerNorm (2C) and the head, C × vocab weights and vocab "
                 "biases."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no LayerNorms": (_count(norms=False), "its LayerNorms alone hold"),
              "no position table": (_count(positions=False), "its position table alone holds"),
              "MLP C -> C": (_count(hidden=1), "where the model holds 134,273"),
          },
          answer="transformer_parameters", alternate_cell='''
# Exercise 12.parameter_count · how many numbers does training change?
def transformer_parameters(layers, width, context, vocab=257):
    linear = lambda n_in, n_out: n_in * n_out + n_out   # weights and biases
    norm = 2 * width
    block = 2 * norm + 4 * linear(width, width) + linear(width, 4 * width) + linear(4 * width, width)
    return (vocab + context) * width + layers * block + norm + linear(width, vocab)
''', solution_cell='''
# Exercise 12.parameter_count · how many numbers does training change?
def transformer_parameters(layers, width, context, vocab=257):
    C = width
    block = 2 * (2 * C) + 4 * (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return vocab * C + context * C + layers * block + 2 * C + (C * vocab + vocab)
''')
def parameter_count(answer):
    for layers, width, heads, context in [(2, 64, 4, 16), (2, 128, 4, 64), (3, 48, 2, 32)]:
        model = Transformer(TransformerConfig(layers=layers, width=width, heads=heads, context=context))
        want = model.parameter_count()
        on = f"layers {layers}, width {width}, context {context}"
        got = number(call(answer, layers, width, context, VOCAB, on=on), "the count")
        if got != want:
            names = {name: p.size for name, p in model.named_parameters()}
            norms = sum(v for k, v in names.items() if "norm" in k)
            hint = (f"; its LayerNorms alone hold {norms:,}" if want - got == norms else
                    f"; its position table alone holds {context * width:,}" if want - got == context * width
                    else "")
            raise Wrong(f"{got:,.0f} parameters for {on} where the model holds {want:,}{hint}.")
    return "equal to the model's own count at three sizes"


def _post_ln(tape, block, x):  # planted
    x = block.attention_norm(tape, x + block.attention(tape, x))
    return block.mlp_norm(tape, x + block.mlp(tape, x))


def _mlp_replaces(tape, block, x):  # planted
    x = x + block.attention(tape, block.attention_norm(tape, x))
    return block.mlp(tape, block.mlp_norm(tape, x))


def _one_norm(tape, block, x):  # planted
    x = x + block.attention(tape, block.attention_norm(tape, x))
    return x + block.mlp(tape, block.attention_norm(tape, x))


def _half_post_ln(tape, block, x):  # planted: the attention half post-LN, the MLP half pre-LN
    x = block.attention_norm(tape, x + block.attention(tape, x))
    return x + block.mlp(tape, block.mlp_norm(tape, x))


def _norm_on_output(tape, block, x):  # planted: each LayerNorm on its branch's output
    x = x + block.attention_norm(tape, block.attention(tape, x))
    return x + block.mlp_norm(tape, block.mlp(tape, x))


def _parallel(tape, block, x):  # planted
    return x + block.attention(tape, block.attention_norm(tape, x)) + block.mlp(tape, block.mlp_norm(tape, x))


def _mlp_first(tape, block, x):  # planted
    x = x + block.mlp(tape, block.mlp_norm(tape, x))
    return x + block.attention(tape, block.attention_norm(tape, x))


def norm_over(tape, norm, x, axis=-1):
    """A LayerNorm written out on the tape, over `axis`: (x − mean) / √(var + ε) · weight + bias."""
    centred = x - tape.mean(x, axis, keepdim=True)
    var = tape.mean(centred * centred, axis, keepdim=True)
    return centred / tape.power(var + norm.eps, 0.5) * norm.weight.var(tape) + norm.bias.var(tape)


def _positions_norm(tape, block, x):  # planted: each channel normalised over the positions
    x = x + block.attention(tape, norm_over(tape, block.attention_norm, x, axis=-2))
    return x + block.mlp(tape, norm_over(tape, block.mlp_norm, x, axis=-2))


def _cut(tape, block, x):  # planted: the right values, with the gradient cut off
    return tape.constant(block(tape, x).value)


def _block_mistakes(b, x: np.ndarray) -> list:
    """What each common mistake computes on x, with the sentence that names it."""
    def run(fn):
        t = Tape("cpu64")
        return np.asarray(fn(t, b, t.constant(x)).value)
    return [(run(_post_ln), "this is the post-LN block of the original Transformer, LN(x + f(x)): "
                            "pre-LN normalises the branch's input and leaves the sum alone"),
            (run(_mlp_replaces), "the MLP's output replaces x instead of being added to it: both "
                                 "halves are residuals"),
            (run(_parallel), "this is the parallel block (GPT-J's): the MLP reads x, not x plus the "
                             "attention's output; add the attention first, then normalise that sum "
                             "for the MLP"),
            (run(_mlp_first), "the MLP first, then the attention: the block gathers from earlier "
                              "positions first and works on what it gathered after"),
            (run(_half_post_ln), "the attention half is post-LN, LN(x + attention(x)), and the MLP half "
                                 "pre-LN: both halves normalise the branch's input and leave the sum alone"),
            (run(_norm_on_output), "each LayerNorm is on its branch's output, x + LN(f(x)): pre-LN "
                                   "normalises what goes into the attention and the MLP, f(LN(x))"),
            (run(_one_norm), "both halves use attention_norm: each half has its own LayerNorm, "
                             "block.attention_norm before the attention and block.mlp_norm before the MLP"),
            (run(_positions_norm), "the LayerNorm runs over the positions (axis −2) instead of each "
                                   "position's C channels (the last axis)")]


@exercise("12.block", title="the pre-LN block: x + attention(LN(x)), then x + MLP(LN(x))",
          hints=("Two lines, each a residual: x = x + something(x). The sum keeps a straight path "
                 "for the gradient.",
                 "Pre-LN: the LayerNorm goes on the branch, before the attention or the MLP, never "
                 "on the sum.",
                 "x = x + block.attention(tape, block.attention_norm(tape, x)); then "
                 "x = x + block.mlp(tape, block.mlp_norm(tape, x)); return x."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "post-LN": (_post_ln, "post-LN block"),
              "MLP replaces x": (_mlp_replaces, "replaces x instead of being added"),
              "one LayerNorm for both": (_one_norm, "each half has its own LayerNorm"),
              "half post-LN": (_half_post_ln, "the attention half is post-LN"),
              "LayerNorm on the output": (_norm_on_output, "on its branch's output"),
              "a NumPy array": (lambda tape, block, x: np.zeros((2, 5, 16)), "returns the tape's Var"),
              "parallel block": (_parallel, "parallel block"),
              "MLP first": (_mlp_first, "the MLP first"),
              "LayerNorm over the positions": (_positions_norm, "over the positions"),
              "the gradient cut": (_cut, "gradient"),
          },
          answer="block_forward", alternate_cell='''
# Exercise 12.block · one pre-LN block from its pieces
def block_forward(tape, block, x):
    def layer_norm(norm, h):                             # written out, over each position's C
        centred = h - tape.mean(h, -1, keepdim=True)
        var = tape.mean(centred * centred, -1, keepdim=True)
        return centred / tape.power(var + norm.eps, 0.5) * norm.weight.var(tape) + norm.bias.var(tape)
    h = x + block.attention(tape, layer_norm(block.attention_norm, x))
    return h + block.mlp(tape, layer_norm(block.mlp_norm, h))
''', solution_cell='''
# Exercise 12.block · one pre-LN block from its pieces
def block_forward(tape, block, x):
    """x (B, T, C) -> (B, T, C): each half normalises its input and adds its output back."""
    x = x + block.attention(tape, block.attention_norm(tape, x))   # gather from earlier positions
    return x + block.mlp(tape, block.mlp_norm(tape, x))            # then work on it, per position
''')
def block(answer):
    model = Transformer(TransformerConfig(layers=1, width=16, heads=2, context=8), backend="cpu64", seed=3)
    rng = np.random.default_rng(12)
    for _, p in model.named_parameters():  # weights large enough that every mistake shows
        p.assign(p.numpy() + rng.normal(size=p.shape) * 0.3)
    x = rng.normal(size=(2, 5, 16))
    tape = Tape("cpu64")
    xv = tape.leaf(x)
    want = np.asarray(model.blocks[0](tape, xv).value)
    on = "one block of width 16, 2 heads, x random (2, 5, 16)"
    got = call(answer, tape, model.blocks[0], xv, on=on)
    if not isinstance(got, Var):
        raise Wrong(f"block_forward returns the tape's Var, got {type(got).__name__}.")
    value = np.asarray(got.value)
    b = model.blocks[0]
    if value.shape == want.shape and not np.allclose(value, want):
        for wrong, why in _block_mistakes(b, x):
            if np.allclose(value, wrong):
                raise Wrong(f"{why} ({on}).")
    compare("block_forward(x)", value, want, on=on, source="the model's block gives")
    # The values can be right with the gradient cut (a constant, .value): compare every gradient.
    weights = rng.normal(size=want.shape)
    ref = Tape("cpu64")
    ref_x = ref.leaf(x)
    mine = ref.backward(ref.sum(model.blocks[0](ref, ref_x) * ref.constant(weights)))
    t = Tape("cpu64")
    tx = t.leaf(x)
    out = call(answer, t, b, tx, on=on)
    theirs = t.backward(t.sum(out * t.constant(weights)))
    for name, p in [("x", None), *b.named_parameters()]:
        g_want = mine[ref_x] if p is None else p.grad(mine)
        g_got = theirs[tx] if p is None else p.grad(theirs)
        if g_got is None or not np.any(g_got):
            raise Wrong(f"the values are right but no gradient reaches {name} ({on}): part of the "
                        "block was computed off the tape (.value, tape.constant), so training "
                        "would never change it.")
        compare(f"the gradient of {name}", g_got, g_want, on=on, source="the model's block gives")
    return "equal to the model's own block, its gradients included"
