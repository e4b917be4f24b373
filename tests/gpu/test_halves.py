"""The 16-bit copies bf16 and fp16 products read (backends/cuda/halves.py): each kernel that makes
a float32 array a product reads writes its copy, which is the CPU's rounding of that array
(precision.round_to) bit for bit; a Transformer step then rounds nothing in a launch of its own,
and its weights' copies follow every update."""

import numpy as np
import pytest

from smallem.autodiff.operations import CrossEntropy, LayerNorm
from smallem.backends import get_backend, gpu_available
from smallem.backends.precision import round_to

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]
HALF = ("bf16", "fp16")


def assert_copy(x, precision):
    """x's registered copy, read as float32, has the bits of the CPU's rounding of x."""
    import ml_dtypes

    from smallem.backends.cuda import halves

    half = halves.lookup(x, precision)
    assert half is not None, "no 16-bit copy was registered"
    bits = half.get().view(np.uint16)
    got = bits.view(ml_dtypes.bfloat16 if precision == "bf16" else np.float16).astype(np.float32)
    want = round_to(x.get(), precision)
    np.testing.assert_array_equal(got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32))


@pytest.mark.parametrize("precision", HALF)
def test_every_producer_writes_the_cpus_rounding_of_its_output(precision):
    from smallem.backends.cuda import cross_entropy, gelu, layer_norm

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(0)
    x = be.tensor(3 + 2 * rng.normal(size=(4, 16, 48)))
    w, b = be.tensor(1 + 0.3 * rng.normal(size=48)), be.tensor(0.1 * rng.normal(size=48))
    y = layer_norm.layer_norm_forward(be, x, w, b, LayerNorm())
    assert_copy(y, precision)
    dx = layer_norm.layer_norm_rule(be, x, y, x, w, b, LayerNorm())[0]
    assert_copy(dx, precision)
    wide = be.tensor(rng.uniform(-12, 12, size=(4, 16, 96)))
    assert_copy(be.gelu(wide), precision)
    assert_copy(gelu.gelu_rule(be, wide, wide, wide)[0], precision)
    assert_copy(be.add(x, y), precision)  # one shape: a residual, two gradients summed
    heads = be.tensor(rng.normal(size=(2, 4, 16, 12)))  # (B, H, T, D)
    merged = be.reshape(be.transpose(heads, 1, 2), (2, 16, 48))  # (B, T, C)
    np.testing.assert_array_equal(merged.get(), heads.get().transpose(0, 2, 1, 3).reshape(2, 16, 48))
    assert_copy(merged, precision)
    logits = be.tensor(5 * rng.normal(size=(64, 257)))
    op = CrossEntropy(rng.integers(0, 257, size=64))
    d_logits = cross_entropy.cross_entropy_rule(be, be.tensor(np.ones(())), None, logits, op)[0]
    assert_copy(d_logits, precision)


@pytest.mark.parametrize("precision", HALF)
def test_the_optimizers_write_each_matrix_copy_as_they_update_it(precision):
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(1)
    shapes = [(64, 48), (48,), (9, 7), (3, 3), (5,), (2, 2), (8, 8), (4, 6), (6, 4), (33, 2)]
    params = [be.tensor(rng.normal(size=s)) for s in shapes]  # ten: two launches
    moments = [(be.zeros(s), be.zeros(s)) for s in shapes]
    for step in (1, 2, 3):
        grads = [be.tensor(rng.normal(size=s)) for s in shapes]
        be.adamw_update(params, grads, [m for m, _ in moments], [v for _, v in moments],
                        steps=[step] * len(shapes), lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
                        weight_decays=[0.1] * len(shapes))
        for p in params:
            if p.ndim == 2:
                assert_copy(p, precision)
    be.sgd_update(params, [be.tensor(rng.normal(size=s)) for s in shapes], lr=0.1)
    for p in params:
        if p.ndim == 2:
            assert_copy(p, precision)


def test_a_copy_goes_with_its_array_and_fp32_makes_none():
    from smallem.backends.cuda import halves

    be = get_backend("gpu", "bf16")
    x = be.tensor(np.ones((8, 8)))
    y = be.add(x, x)
    key = ("bf16", y.data.ptr)
    assert key in halves._copies
    del y  # its memory may be handed to another array now: the copy must not outlive it
    assert key not in halves._copies
    fp32 = get_backend("gpu")
    z = fp32.add(x, x)
    assert halves.lookup(z, "bf16") is None and halves.lookup(z, "fp16") is None


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("staged, tiled, key_wg, lf", [
    (1, 0, 0, 0), (0, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 1, 1)])
def test_attention_writes_the_cpus_rounding_of_its_outputs(precision, staged, tiled, key_wg, lf,
                                                           monkeypatch):
    """The tensor-core attention (attention_mma.py) writes O's copy in its forward and dK's, dV's
    in its backward, dQ's by the last key block adding to each query tile (the others' additions
    seen): each the CPU's rounding of the float32 array, laid out as its memory ((B, T, H, D): the
    merged heads read it). Causal and not, T not a multiple of the tiles, one key block and many;
    by today's key kernel (Q staged or converted), the 2-D tiled one or, at D 64 on sm_90a
    modules, the wgmma one (round 11; with its grid (B·H, key blocks) too: dQ's copy tail counts
    the key blocks a head by the grid's other side)."""
    from smallem.autodiff.attention import Attention
    from smallem.backends.cuda import attention, attention_mma

    monkeypatch.setattr(attention_mma, "DQ_COPY", True)  # off by default: slower than the Linear's
    monkeypatch.setitem(attention_mma.CONFIG, "staged", {w: (int(staged),) * 2 for w in attention_mma.WIDTHS})
    monkeypatch.setitem(attention_mma.CONFIG, "tiled", {**attention_mma.CONFIG["tiled"], 64: tiled})
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], 64: key_wg})
    monkeypatch.setitem(attention_mma.CONFIG, "key_lf", {**attention_mma.CONFIG["key_lf"], 64: lf})
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(5)
    for d, t, causal in ((64, 300, True), (128, 130, True), (32, 77, False), (64, 40, True)):
        q, k, v, g = (be.tensor(rng.normal(size=(2, t, 3, d))).transpose(0, 2, 1, 3) for _ in range(4))
        op = Attention(causal=causal, copies=True)
        out = attention.attention_forward(be, q, k, v, op)
        grads = attention.attention_rule(be, g, out, q, k, v, op)
        for x in (out, *grads):
            assert_copy(x.base, precision)


@pytest.mark.parametrize("precision", HALF)
def test_attention_writes_no_copy_that_nothing_reads(precision, monkeypatch):
    """Without a 16-bit product reading its outputs (Attention's copies off: a bench, a lesson)
    the tensor-core kernels get null pointers and register nothing; the float32 outputs are the
    same numbers as with the copies (dQ's up to the order of its atomic additions)."""
    from smallem.autodiff.attention import Attention
    from smallem.backends.cuda import attention, attention_mma, halves

    monkeypatch.setattr(attention_mma, "DQ_COPY", True)
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(6)
    q, k, v, g = (be.tensor(rng.normal(size=(2, 200, 3, 64))).transpose(0, 2, 1, 3) for _ in range(4))
    made = {}
    for copies in (False, True):
        op = Attention(causal=True, copies=copies)
        out = attention.attention_forward(be, q, k, v, op)
        grads = attention.attention_rule(be, g, out, q, k, v, op)
        made[copies] = [x.get() for x in (out, *grads)]
        registered = [halves.lookup(x.base, precision) is not None for x in (out, *grads)]
        assert registered == ([True] * 4 if copies else [False] * 4)
    for plain, copied in zip(*made.values()):
        np.testing.assert_allclose(plain, copied, rtol=0, atol=1e-5 * np.abs(copied).max())


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("capture", [False, True])
@pytest.mark.parametrize("dq_copy", [True, False])
def test_a_transformer_step_rounds_nothing_on_its_own(precision, capture, dq_copy, monkeypatch):
    """After the first step (whose update writes the weights' first copies), every operand of
    every product has its copy: none is rounded in a launch of its own, plain or captured. Until
    round 8 attention's outputs were (5 launches a block: O for the output Linear's forward and
    weight gradient, each of dQ, dK, dV for its Linear's backward); the tensor-core kernels
    (attention_mma.py) now write their copies, laid out as the float32 arrays, so that merging
    the heads is a view of both; with DQ_COPY off, dQ's copy is the Linear's to make, one launch a
    block. The weights' copies follow every update."""
    from smallem.backends.cuda import attention_mma, halves, qkv
    from smallem.models.transformer import Transformer, TransformerConfig
    from smallem.optim import AdamW
    from smallem.training.step import make_step

    monkeypatch.setattr(attention_mma, "DQ_COPY", dq_copy)

    be = get_backend("gpu", precision)
    model = Transformer(TransformerConfig(), be, seed=3)  # the default: fused attention
    step = make_step(be, model, AdamW(lr=1e-3), capture=capture)
    rng = np.random.default_rng(4)
    batch = lambda: (rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64)))
    step(*batch())
    before = halves.ROUNDINGS[0]
    losses = [float(be.item(step(*batch()))) for _ in range(4)]
    # recording a graph rounds as a plain step does, and its replays launch what it recorded
    steps_counted = 1 if capture else 4  # plain: four steps; captured: the recording alone
    # round 7: 5 (attention's O twice, dQ, dK, dV); round 9's qkv_attention joins dq, dk, dv and
    # writes dP's copy in the join, so dQ's Linear rounds nothing either
    per_block = 0 if dq_copy or qkv.QKV else 1
    assert halves.ROUNDINGS[0] - before == steps_counted * per_block * model.config.layers
    assert np.all(np.isfinite(losses))
    if capture:
        assert step.graph is not None and step.replays >= 2
    for p in model.parameters():
        if p.value.ndim == 2:
            assert_copy(p.value, precision)
