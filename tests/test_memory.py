"""tape.memory(): bytes per node and per op, kept for backward, peak; checkpointing's gradients
bit-equal to the unsegmented run and its kept bytes cut as lesson 15's formula predicts."""

import numpy as np
import pytest

from smallem.autodiff import Tape, checkpoint
from smallem.errors import SmallemError
from smallem.models.transformer import CausalSelfAttention, Transformer, TransformerConfig


def _batch(b: int, t: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 257, (b, t)), rng.integers(0, 257, (b, t))


def test_every_buffer_is_counted_once_views_hold_nothing():
    tape = Tape("cpu64")
    x = tape.leaf(np.ones((4, 3)))
    y = tape.exp(x)  # 96 bytes of its own
    z = tape.transpose(tape.reshape(y, (3, 4)))  # views of y: nothing new
    total = tape.sum(z * 2.0)  # a constant 2.0, a product (96 bytes), a scalar
    report = tape.memory()
    by_index = {m.index: m for m in report.nodes}
    assert by_index[y.index].bytes == 96 and by_index[z.index].bytes == 0
    assert report.leaves == 96 + 8  # the leaf and the constant 2.0
    assert report.kept == 96 + 96 + 8 and report.by_op == {"exp": 96, "reshape": 0, "transpose": 0,
                                                       "mul": 96, "sum": 8}
    assert report.gradients is None and report.peak is None
    tape.backward(total)
    after = tape.memory()
    assert after.gradients > 0 and after.peak == after.kept + after.leaves + after.gradients


@pytest.mark.parametrize("b, t, c, h", [(2, 8, 16, 2), (3, 12, 8, 4)])
def test_one_attention_layer_holds_what_the_formula_says(b, t, c, h):
    """The unfused layer keeps 10 (B, T, C) tensors (q, k, v before and after their biases, the
    mixed heads, their merge, the output before and after its bias) and 3 (B, H, T, T) ones
    (q kᵀ, the scaled scores, the weights); fused, the three become one (B, H, T) log-sum-exp,
    and the merge of the heads is a view (the output is laid out (B, T, H, D))."""
    for mode, expected in (("unfused", 10 * b * t * c + 3 * b * h * t * t),
                           ("fused", 9 * b * t * c + b * h * t)):
        layer = CausalSelfAttention(TransformerConfig(width=c, heads=h, context=t, attention=mode),
                                    "cpu", np.random.default_rng(0))
        tape = Tape("cpu")
        layer(tape, tape.leaf(np.random.default_rng(1).normal(size=(b, t, c))))
        assert tape.memory().kept == 4 * expected  # float32: 4 bytes a number


def test_cpu_float32_counts_half_of_float64():
    x, y = _batch(2, 16)
    kept = {}
    for be in ("cpu", "cpu64"):
        model = Transformer(TransformerConfig(context=16, layers=1), be)
        tape = Tape(be)
        model.loss(tape, x, y)
        kept[be] = tape.memory().kept
    assert kept["cpu64"] == 2 * kept["cpu"]  # same nodes, 8 bytes a number instead of 4


def test_largest_nodes_of_the_transformer_are_its_attention_matrices():
    x, y = _batch(2, 128)  # at T = 128 the (T, T) matrices outgrow the (T, V) logits
    tape = Tape("cpu")
    Transformer(TransformerConfig(context=128, width=32, heads=4, attention="unfused"), "cpu").loss(
        tape, x, y)
    top = tape.memory().largest(6)
    assert {m.op for m in top} == {"matmul", "mul", "softmax"}
    assert all(m.shape == (2, 4, 128, 128) for m in top)


@pytest.mark.parametrize("attention", ["unfused", "fused"])
@pytest.mark.parametrize("backend", ["cpu64", "cpu"])
def test_checkpointed_blocks_give_bit_equal_gradients(backend, attention):
    x, y = _batch(3, 24)
    grads, kept = {}, {}
    for ck in (False, True):
        model = Transformer(TransformerConfig(context=24, attention=attention, checkpoint_blocks=ck),
                            backend, seed=3)
        tape = Tape(backend)
        g = tape.backward(model.loss(tape, x, y))
        grads[ck] = [np.asarray(p.grad(g)) for p in model.parameters()]
        kept[ck] = tape.memory()
    assert all(np.array_equal(a, b) for a, b in zip(grads[False], grads[True]))
    assert kept[True].kept < kept[False].kept / 4
    assert any(op == "checkpoint" for op in kept[True].by_op)
    assert kept[True].gradients < kept[False].gradients  # the blocks' inner gradients are gone


def test_checkpointing_every_block_keeps_what_the_formula_predicts():
    """Per block, unfused: 28 (B, T, C) + 3 (B, H, T, T) values kept; checkpointed: the block's
    output alone, one (B, T, C). The cut in kept bytes is at least that ratio per block."""
    b, t, c, h, layers = 2, 32, 32, 4, 2
    x, y = _batch(b, t)
    kept = {}
    for ck in (False, True):
        tape = Tape("cpu")
        Transformer(TransformerConfig(layers=layers, width=c, heads=h, context=t,
                                      attention="unfused", checkpoint_blocks=ck), "cpu").loss(tape, x, y)
        kept[ck] = tape.memory().kept
    per_block = 4 * (28 * b * t * c + 3 * b * h * t * t)
    assert kept[False] - kept[True] == layers * (per_block - 4 * b * t * c)


def test_peak_counts_the_recomputed_segment():
    tape = Tape("cpu64")
    x, w = tape.leaf(np.ones((8, 8))), tape.leaf(np.eye(8))
    y = checkpoint(tape, lambda t, a, b: t.exp(t.tanh(a @ b)), x, w)
    tape.backward(tape.sum(y))
    report = tape.memory()
    op = tape.nodes[y.index].args[0]
    assert op.recomputed >= 3 * 8 * 8 * 8  # matmul, tanh, exp recomputed, 512 bytes each
    assert report.peak >= report.kept + report.leaves + op.recomputed


def test_checkpoint_refuses_a_segment_that_returns_no_var_of_its_tape():
    tape = Tape("cpu64")
    with pytest.raises(SmallemError, match="must return a Var"):
        checkpoint(tape, lambda t, a: np.ones(2), tape.leaf(np.ones(2)))


def test_checkpoint_of_a_block_without_its_module_is_refused_not_trained_frozen():
    block = Transformer(TransformerConfig(layers=1, width=8, heads=2, context=4), "cpu64").blocks[0]
    tape = Tape("cpu64")
    x = tape.leaf(np.random.default_rng(0).normal(size=(1, 4, 8)))
    with pytest.raises(SmallemError, match=r"reads \d+ parameter\(s\) that are not its inputs .*"
                                           r"train frozen: pass the Module it reads"):
        checkpoint(tape, block, x)
    tape = Tape("cpu64")
    y = checkpoint(tape, block, tape.leaf(np.random.default_rng(1).normal(size=(1, 4, 8))), module=block)
    grads = tape.backward(tape.sum(y))
    assert all(np.abs(grads[p.var(tape)]).max() > 0 for p in block.parameters()[:2])


def test_transformer_config_refuses_bad_memory_fields():
    with pytest.raises(SmallemError, match="attention must be one of"):
        TransformerConfig(attention="flash")
    with pytest.raises(SmallemError, match="checkpoint_blocks"):
        TransformerConfig(checkpoint_blocks="yes")


def test_the_cli_trains_with_checkpointed_blocks_and_the_checkpoint_keeps_the_switches(tmp_path,
                                                                                      capsys):
    from smallem.tools.cli import main
    from smallem.training.checkpoint import load_checkpoint

    path = tmp_path / "t.npz"
    args = ["train", "--model", "transformer", "--backend", "cpu", "--steps", "2", "--batch", "2",
            "--context", "16", "--width", "16", "--heads", "2", "--log-every", "1",
            "--eval-every", "2"]
    assert main([*args, "--checkpoint-blocks", "--attention", "fused", "--save", str(path)]) == 0
    sizes = load_checkpoint(path).config["sizes"]
    assert sizes["checkpoint_blocks"] is True and sizes["attention"] == "fused"
    weights = []
    for flag in ("--checkpoint-blocks", "--no-checkpoint-blocks"):  # how, not what: both resume
        leg = tmp_path / f"leg{flag}.npz"
        assert main([*args, "--steps", "3", "--resume", str(path), flag, "--save", str(leg)]) == 0
        weights.append(load_checkpoint(leg).parameters)
    assert weights[0].keys() == weights[1].keys()
    assert all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])  # bit-equal
    assert main([*args, "--attention", "flash"]) != 0
    assert "attention must be one of auto, fused, unfused" in capsys.readouterr().err
