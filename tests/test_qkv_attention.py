"""qkv_attention (autodiff/qkv_attention.py), the GPU's q, k, v as one product: its reference
forward and rule give the three Linears' and attention's numbers bit for bit, so a Transformer on
a backend that fuses it computes what it did; the parameters and their names do not change."""

import numpy as np
import pytest

from smallem import Tape
from smallem.autodiff.qkv_attention import QkvAttention
from smallem.backends.numpy import NumpyBackend
from smallem.errors import SmallemError
from smallem.models.transformer import Transformer, TransformerConfig


def _fusing_qkv() -> NumpyBackend:
    """cpu64 declaring a fused forward for qkv_attention that declines: the reference runs."""
    be = NumpyBackend("float64")
    be.fused_forward = {**be.fused_forward, "qkv_attention": lambda *args: None}
    return be


def test_the_transformer_with_the_node_is_the_three_linears_bit_for_bit():
    config = TransformerConfig(width=16, heads=2, context=8, attention="fused")
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 257, (3, 8)), rng.integers(0, 257, (3, 8))
    results = []
    for be in ("cpu64", _fusing_qkv()):
        model = Transformer(config, be, seed=0)
        tape = Tape(be)
        loss = model.loss(tape, x, y)
        g = tape.backward(loss)
        ops = [n.op for n in tape.nodes if n.op]
        results.append((ops, model.parameter_names(), float(loss.value),
                        [p.grad(g) for p in model.parameters()]))
    (ops_apart, names_apart, loss_apart, apart), (ops_one, names_one, loss_one, one) = results
    assert ops_one.count("qkv_attention") == 2 and "qkv_attention" not in ops_apart
    assert ops_one.count("attention") == 0 and ops_apart.count("attention") == 2
    assert names_one == names_apart  # the same parameters: checkpoints load either way
    assert loss_one == loss_apart
    for a, b in zip(apart, one):
        assert np.array_equal(a, b)


def test_the_node_is_left_out_where_rules_are_planted_or_attention_is_unfused():
    be = _fusing_qkv()
    x = np.random.default_rng(0).integers(0, 257, (2, 8))
    for attention, rules in (("unfused", None), ("fused", {"add": lambda *a: None})):
        model = Transformer(TransformerConfig(width=16, heads=2, context=8, attention=attention), be)
        tape = Tape(be, rules=rules)
        model.logits(tape, x)
        assert "qkv_attention" not in [n.op for n in tape.nodes]


@pytest.mark.parametrize("shapes", [[(2, 3, 5)] + [(5, 5), (5,)] * 3,  # 5 not a multiple of 2 heads
                                    [(2, 3, 4)] + [(4, 4), (4,)] * 2 + [(4, 3), (4,)],
                                    [(3, 4)] + [(4, 4), (4,)] * 3])
def test_shapes_that_do_not_fit_are_one_sentence(shapes):
    with pytest.raises(SmallemError, match="qkv_attention: input"):
        QkvAttention(2).check(*shapes)
