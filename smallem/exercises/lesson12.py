"""Lesson 12, the Transformer: its parameter count for any size, and the pre-LN block written
from the model's own pieces, graded against models.Transformer."""

from __future__ import annotations

import numpy as np

from ..autodiff.tape import Tape, Var
from ..models.transformer import Transformer, TransformerConfig
from .grading import Wrong, call, compare, exercise, number


def _count(norms=True, positions=True, hidden=4):
    """A planted parameter count that forgets one piece."""
    def count(layers, width, context, vocab=257):
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
          answer="transformer_parameters", solution_cell='''
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
        got = number(call(answer, layers, width, context, 257, on=on), "the count")
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
              "one LayerNorm for both": (_one_norm, "where the model's block gives"),
              "a NumPy array": (lambda tape, block, x: np.zeros((2, 5, 16)), "returns the tape's Var"),
          },
          answer="block_forward", solution_cell='''
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
        t = Tape("cpu64")
        xs = t.constant(x)
        post = b.mlp_norm(t, (h := b.attention_norm(t, xs + b.attention(t, xs))) + b.mlp(t, h))
        if np.allclose(value, post.value):
            raise Wrong(f"this is the post-LN block of the original Transformer, LN(x + f(x)) "
                        f"({on}): pre-LN normalises the branch's input and leaves the sum alone.")
        t = Tape("cpu64")
        h = t.constant(x) + b.attention(t, b.attention_norm(t, t.constant(x)))
        if np.allclose(value, b.mlp(t, b.mlp_norm(t, h)).value):
            raise Wrong(f"the MLP's output replaces x instead of being added to it ({on}): "
                        "both halves are residuals.")
    compare("block_forward(x)", value, want, on=on, source="the model's block gives")
    return "equal to the model's own block"
