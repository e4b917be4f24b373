"""Lesson 05, the byte MLP: its parameter count and its forward pass, graded by the model."""

from __future__ import annotations

import numpy as np

from ..autodiff.tape import Tape
from ..models.mlp import Mlp, MlpConfig
from ..nn import Embedding, Linear
from .grading import Wrong, call, compare, describe, exercise, number


@exercise("05.parameter_count", title="the parameter count of the byte MLP",
          hint="an embedding table of vocab × embed; a hidden layer from context·embed inputs to "
               "hidden units plus one bias per unit; an output layer from hidden to vocab, plus one "
               "bias per score.",
          answer="parameter_count", solution_cell='''
# Exercise 05.parameter_count · how many numbers does training change?
def parameter_count(context, embed, hidden, vocab):
    embedding = vocab * embed                           # one vector per token
    hidden_layer = context * embed * hidden + hidden    # the side-by-side vectors in, + biases
    output_layer = hidden * vocab + vocab               # hidden units to scores, + biases
    return embedding + hidden_layer + output_layer
''')
def parameter_count(answer):
    for sizes in [(16, 32, 512, 257), (8, 24, 100, 257), (3, 5, 7, 11)]:
        model = Mlp(MlpConfig(*sizes), backend="cpu64")
        on = "context, embed, hidden, vocab = " + ", ".join(map(str, sizes))
        got = number(call(answer, *sizes, on=on), "parameter_count")
        if got != model.parameter_count():
            parts = ", ".join(f"{name} {p.size:,}" for name, p in model.named_parameters())
            raise Wrong(f"parameter_count{sizes} is {got:,.0f} where the model holds "
                        f"{model.parameter_count():,} ({parts}).")
    return "matches Mlp.parameter_count() for the seed's sizes (402,721) and two others"


@exercise("05.side_by_side", title="embed each byte and lay the vectors side by side",
          hint="table[contexts] looks every byte up at once, (B, T) -> (B, T, C); then reshape to "
               "(B, T·C), so each position keeps its own slot.",
          answer="side_by_side", solution_cell='''
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
          hint="W is stored (in, out), as in GPT-2: y = x @ W + b, with the bias broadcast over "
               "every row (and every position, for a (B, T, in) input).",
          answer="linear_forward", solution_cell='''
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
