"""Lesson 05, the byte MLP: its parameter count and its forward pass, graded by the model."""

from __future__ import annotations

import numpy as np

from ...autodiff.tape import Tape
from ...data import VOCAB
from ...models.mlp import Mlp, MlpConfig
from ...nn import Embedding, Linear
from ..common.graders import Wrong, call, compare, describe, number
from ..common.grading import exercise


@exercise("05.parameter_count", title="the parameter count of the byte MLP",
          hints=("Count the three parts separately: the embedding table, the hidden layer, the output "
                 "layer. A Linear layer from n inputs to m outputs holds n·m weights and m biases.",
                 "The table holds one vector of `embed` numbers per token: vocab × embed. The hidden "
                 "layer reads the context's vectors side by side, context·embed inputs.",
                 "Add up vocab·embed, context·embed·hidden + hidden, and hidden·vocab + vocab."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no biases": (lambda c, e, h, v: v * e + c * e * h + h * v, "where the model holds 402,721"),
              "one byte of context": (lambda c, e, h, v: v * e + e * h + h + h * v + v,
                                      "hidden.weight 262,144"),
          },
          answer="parameter_count", alternate_cell='''
# Exercise 05.parameter_count · how many numbers does training change?
def parameter_count(context, embed, hidden, vocab):
    layers = [(context * embed, hidden), (hidden, vocab)]     # (inputs, outputs) of each Linear
    return vocab * embed + sum(n_in * n_out + n_out for n_in, n_out in layers)
''', solution_cell='''
# Exercise 05.parameter_count · how many numbers does training change?
def parameter_count(context, embed, hidden, vocab):
    embedding = vocab * embed                           # one vector per token
    hidden_layer = context * embed * hidden + hidden    # the side-by-side vectors in, + biases
    output_layer = hidden * vocab + vocab               # hidden units to scores, + biases
    return embedding + hidden_layer + output_layer
''')
def parameter_count(answer):
    for sizes in [(16, 32, 512, VOCAB), (8, 24, 100, VOCAB), (3, 5, 7, 11)]:
        model = Mlp(MlpConfig(*sizes), backend="cpu64")
        on = "context, embed, hidden, vocab = " + ", ".join(map(str, sizes))
        got = number(call(answer, *sizes, on=on), "parameter_count")
        if got != model.parameter_count():
            parts = ", ".join(f"{name} {p.size:,}" for name, p in model.named_parameters())
            raise Wrong(f"parameter_count{sizes} is {got:,.0f} where the model holds "
                        f"{model.parameter_count():,} ({parts}).")
    return "matches Mlp.parameter_count() for the seed's sizes (402,721) and two others"


@exercise("05.side_by_side", title="embed each byte and lay the vectors side by side",
          hints=("NumPy indexes with an array of integers: table[contexts] looks every byte up at "
                 "once.",
                 "table[contexts] has shape (B, T, C): one vector per position. The layer after it "
                 "wants one row per example.",
                 "Reshape to (len(contexts), -1): each position keeps its own slot of C numbers, side "
                 "by side (never average or sum them: position matters)."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "reshaped by rows": (lambda table, ctx: table[ctx].reshape(-1, table.shape[1]),
                                   "has shape [20, 3] where it should be [4, 15]"),
              "channels first": (lambda table, ctx: table[ctx].transpose(0, 2, 1).reshape(len(ctx), -1),
                                 "where the model gives"),
          },
          answer="side_by_side", alternate_cell='''
# Exercise 05.side_by_side · contexts (B, T) of byte values -> (B, T·C)
def side_by_side(table, contexts):
    columns = [table[contexts[:, t]] for t in range(contexts.shape[1])]   # (B, C) for each position
    return np.concatenate(columns, axis=1)                                # position 0's slot first
''', solution_cell='''
# Exercise 05.side_by_side · contexts (B, T) of byte values -> (B, T·C)
def side_by_side(table, contexts):
    vectors = table[contexts]                        # (B, T, C): one row of the table per byte
    return vectors.reshape(len(contexts), -1)       # (B, T·C): side by side, each in its slot
''')
def side_by_side(answer):
    rng = np.random.default_rng(7)
    embedding = Embedding(11, 3, backend="cpu64", rng=rng)
    table = embedding.weight.numpy()
    contexts = rng.integers(0, 11, size=(4, 5))
    tape = Tape("cpu64")
    want = tape.reshape(embedding(tape, contexts), (4, 15)).value  # the model's own two steps
    tape.close()
    on = f"a table of 11 vectors of 3 and contexts of shape [4, 5], contexts[0] = {contexts[0].tolist()}"
    compare("the result", call(answer, table.copy(), contexts.copy(), on=on), want, on=on,
            source="the model gives", shape_hint="B rows of T·C numbers")
    return "the same (B, T·C) matrix as the model's embedding and reshape"


@exercise("05.linear_forward", title="one Linear layer, forward",
          hints=("Check the shapes first: x is (..., in) and W is (in, out). Which product gives "
                 "(..., out)?",
                 "x @ W multiplies over the last axis of x, whatever comes before it, so (B, T, in) "
                 "inputs work too.",
                 "Add b: broadcasting adds the same bias vector to every row. y = x @ W + b."),
          mistakes={  # planted wrong answers, and words each verdict must say (tests)
              "no bias": (lambda x, W, b: x @ W, "where smallem's Linear gives"),
              "W transposed": (lambda x, W, b: x @ W.T + b, "raised ValueError"),
          },
          answer="linear_forward", alternate_cell='''
# Exercise 05.linear_forward · x (..., in), W (in, out), b (out,) -> y (..., out)
def linear_forward(x, W, b):
    x, W, b = (a.astype(np.float32) for a in (x, W, b))   # float32 is plenty: nothing differentiates it
    return np.einsum("...i,io->...o", x, W) + b
''', solution_cell='''
# Exercise 05.linear_forward · x (..., in), W (in, out), b (out,) -> y (..., out)
def linear_forward(x, W, b):
    return x @ W + b        # one row of scores per input row; the bias is added to each
''')
def linear_forward(answer):
    rng = np.random.default_rng(8)
    layer = Linear(5, 3, backend="cpu64", rng=rng)
    layer.bias.assign(rng.normal(size=3))
    W, b = layer.weight.numpy(), layer.bias.numpy()
    for shape in [(4, 5), (2, 4, 5)]:
        x = rng.normal(size=shape)
        tape = Tape("cpu64")
        want = layer(tape, tape.constant(x)).value
        tape.close()
        on = f"x of shape {list(shape)}, W (5, 3), b = " + describe(b=b)[4:]
        compare("y", call(answer, x.copy(), W.copy(), b.copy(), on=on), want, on=on,
                source="smallem's Linear gives")
    return "matches smallem.nn.Linear on (B, in) and (B, T, in) inputs"
