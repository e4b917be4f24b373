"""The fused attention's GPU kernels (backends/cuda/attention.py) against a float64 reference, under
capture, inside the Transformer; tape.memory() the same on GPU and CPU; checkpointing captured."""

import numpy as np
import pytest

from smallem.autodiff import Tape, attention
from smallem.backends import get_backend, gpu_available
from smallem.backends.precision import tolerance
from smallem.models.transformer import Transformer, TransformerConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]


def probabilities(q, k, causal):
    """float64 P = softmax(q kᵀ / √d), the full (T, S) matrix, causal or not."""
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def reference(q, k, v, g, causal):
    """float64, the full (T, S) matrices: O, dQ, dK, dV."""
    d = q.shape[-1]
    p = probabilities(q, k, causal)
    o = p @ v
    ds = p * (g @ v.swapaxes(-1, -2) - (g * o).sum(-1, keepdims=True)) / np.sqrt(d)
    return o, ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ g


def rel(a, b):
    """‖a − b‖ / ‖b‖, or ‖a − b‖ where b is exactly zero (one position: dQ = dK = 0)."""
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (scale if scale > 0 else 1.0))


def run(be, xs, causal):
    """Leaves (B, T, H, D), seen by attention as (B, H, T, D) views, as the Transformer does.
    Also says whether the kernels ran: the forward's (counted) and the rule's (its step's flag)."""
    forward, ran = be.fused_forward["attention"], []

    def counted(*args):
        out = forward(*args)
        ran.append(out is not None)
        return out

    be.fused_forward["attention"] = counted
    try:
        tape = Tape(be)
        leaves = [tape.leaf(x) for x in xs[:3]]
        y = attention(tape, *(tape.transpose(x, 1, 2) for x in leaves), causal=causal)
    finally:
        be.fused_forward["attention"] = forward
    steps = list(tape.backward_steps(y, grad=np.ascontiguousarray(xs[3].swapaxes(1, 2))))
    grads = tape.gradients
    host = [be.to_numpy(y.value)] + [be.to_numpy(grads[x]).swapaxes(1, 2) for x in leaves]
    return host, (ran == [True], any(s.op == "attention" and s.fused for s in steps))


@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 32, True), (2, 100, 100, 2, 64, True), (1, 37, 37, 3, 16, True),
    (2, 50, 70, 2, 32, False), (1, 257, 257, 4, 64, True), (1, 1, 1, 1, 32, True),
    (3, 130, 130, 2, 16, False), (1, 600, 600, 2, 64, True), (1, 200, 200, 2, 128, True),
    (2, 70, 90, 2, 128, False), (1, 300, 300, 1, 64, False), (2, 129, 129, 2, 32, True),
    (2, 2, 2, 3, 64, True), (1, 333, 333, 2, 128, True)])
@pytest.mark.parametrize("float32", ["rows", "flash"])
def test_kernels_match_float64(float32, b, t, s, h, d, causal, monkeypatch):
    """Each float32 version (attention.FLOAT32: the row kernels, or attention_f32.py's tiles at
    widths 32, 64, 128), whichever is the default: within 1e-5 of float64."""
    from smallem.backends.cuda import attention as kernels

    monkeypatch.setattr(kernels, "FLOAT32", float32)
    rng = np.random.default_rng(t * d)
    xs = [rng.normal(size=(b, n, h, d)) for n in (t, s, s, t)]
    got, kernels = run(get_backend("gpu"), [x.astype(np.float32) for x in xs], causal)
    assert kernels == (True, True)  # the forward kernel and the backward kernel both ran
    ref = reference(*(x.swapaxes(1, 2) for x in xs), causal)
    for a, r in zip(got, ref):
        assert np.isfinite(a).all() and rel(a, r) < 1e-5


@pytest.mark.parametrize("d", [32, 64, 128])
def test_the_row_kernels_give_the_same_bits_every_run(d, monkeypatch):
    """attention.FLOAT32 = "rows" is the deterministic choice (flash adds dQ by atomics): two
    runs on the same inputs, many key tiles adding to each row of dQ, agree to the bit."""
    from smallem.backends.cuda import attention as kernels

    monkeypatch.setattr(kernels, "FLOAT32", "rows")
    rng = np.random.default_rng(d)
    xs = [rng.normal(size=(2, 512, 4, d)).astype(np.float32) for _ in range(4)]
    be = get_backend("gpu")
    first, again = run(be, xs, True)[0], run(be, xs, True)[0]
    for a, b in zip(first, again):
        assert np.array_equal(a, b)


def _matches_float64(precision: str, shape: tuple, seed: int, *label) -> None:
    """The kernels as configured now: O, dQ, dK, dV within the format's tolerance of float64 and
    further from it than float32 would be (the inputs really were rounded)."""
    b, t, s, h, d, causal = shape
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(b, n, h, d)) for n in (t, s, s, t)]
    got, kernels_ran = run(get_backend("gpu", precision), [x.astype(np.float32) for x in xs], causal)
    assert kernels_ran == (True, True)
    ref = reference(*(x.swapaxes(1, 2) for x in xs), causal)
    errors = [rel(a, r) for a, r in zip(got, ref)]
    print(*label, precision, shape, [f"{e:.2e}" for e in errors])
    assert all(np.isfinite(a).all() for a in got)
    assert tolerance("fp32") * 10 < max(errors) <= tolerance(precision), errors


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (2, 50, 70, 2, 32, False),
    (1, 200, 200, 2, 128, True), (2, 90, 130, 2, 128, False), (3, 37, 37, 1, 16, True),
    (1, 600, 600, 2, 64, True), (1, 2, 2, 1, 32, True)])
def test_tensor_core_kernels_match_float64_within_the_format(precision, b, t, s, h, d, causal):
    """bf16 / fp16 runs take the mma.sync kernels: each output within the format's tolerance of
    float64, and further from it than float32 would be (the inputs really were rounded). Not
    T = 1: there dQ = dK = 0 is a cancellation, and float64's leftover (1e-16) is no scale."""
    _matches_float64(precision, (b, t, s, h, d, causal), t * d + 1)


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (2, 50, 70, 2, 32, False),
    (1, 200, 200, 2, 128, True), (2, 90, 130, 2, 128, False), (3, 37, 37, 1, 16, True),
    (1, 600, 600, 2, 64, True), (2, 130, 70, 2, 64, False), (1, 2, 2, 1, 32, True)])
def test_each_tensor_core_version_matches_float64(staged, b, t, s, h, d, causal, monkeypatch):
    """The tensor-core kernels (attention_mma.py; the walked tiles converted first, or staged and
    rounded by the kernels themselves as in round 8), whichever is the default: bf16 within its
    tolerance."""
    from smallem.backends.cuda import attention_mma

    monkeypatch.setitem(attention_mma.CONFIG, "staged", {w: (int(staged),) * 2 for w in attention_mma.WIDTHS})
    _matches_float64("bf16", (b, t, s, h, d, causal), t * d + 2, staged)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("warps, kr", [(4, 1), (4, 0), (8, 1)])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (1, 600, 600, 2, 64, True),
    (2, 130, 70, 2, 64, False), (2, 50, 70, 2, 64, False), (1, 2, 2, 1, 64, True)])
def test_the_tiled_key_kernel_matches_float64(precision, warps, kr, b, t, s, h, d, causal, monkeypatch):
    """keyq by FlashAttention-2's 2-D warp tiling (CONFIG["tiled"], round 9b; 64 or 128 keys a
    block, K, V in registers or read each tile): O, dQ, dK, dV within the format's tolerance."""
    from smallem.backends.cuda import attention_mma

    monkeypatch.setitem(attention_mma.CONFIG, "tiled", {**attention_mma.CONFIG["tiled"], d: 1})
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], d: 0})
    monkeypatch.setitem(attention_mma.CONFIG, "key", {**attention_mma.CONFIG["key"], d: (warps, 64, kr, 0)})
    monkeypatch.setitem(attention_mma.CONFIG, "staged", {w: (0, 0) for w in attention_mma.WIDTHS})
    _matches_float64(precision, (b, t, s, h, d, causal), t * d + 3, "tiled", warps, kr)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("blocks, lf", [(0, 0), (3, 0), (3, 1), (0, 4096)])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (1, 600, 600, 3, 64, True),
    (2, 130, 70, 2, 64, False), (1, 100, 300, 2, 64, False), (2, 50, 70, 2, 64, False),
    (1, 2, 2, 1, 64, True), (1, 300, 300, 1, 64, False)])
def test_the_wgmma_key_kernel_matches_float64(precision, blocks, lf, b, t, s, h, d, causal, monkeypatch):
    """keyq by wgmma (CONFIG["key_wg"], round 11; sm_90a modules only; every operand from shared
    memory; round 13: two overlaps inside the warpgroup), its registers uncapped or capped for 3
    blocks a multiprocessor, its grid (B·H, key blocks) from T `lf` on (CONFIG["key_lf"]: 0 never; 1
    every T; the LF twin kernel): O, dQ, dK, dV within the format's tolerance, causal and not, T ≠ S
    both ways, T past the last whole tile, one query tile and many."""
    from smallem.backends.cuda import attention_mma

    if not attention_mma.sm90a():
        pytest.skip("keyq by wgmma needs modules compiled for sm_90a (a compute-capability-9.0 device)")
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], d: 1})
    monkeypatch.setitem(attention_mma.CONFIG, "key_lf", {**attention_mma.CONFIG["key_lf"], d: lf})
    monkeypatch.setitem(attention_mma.CONFIG, "key", {**attention_mma.CONFIG["key"], d: (4, 64, 1, blocks)})
    monkeypatch.setitem(attention_mma.CONFIG, "staged", {w: (0, 0) for w in attention_mma.WIDTHS})
    text = attention_mma.source(formats=(precision,), widths=(d,))
    assert f"{{ mma_key_ss<{int(precision == 'fp16')}, 0>" in text
    assert (f"keyq_lf_{precision}_64(MMA_GRAD_ARGS) {{ mma_key_ss<" in text) == bool(lf)
    _matches_float64(precision, (b, t, s, h, d, causal), t * d + 5, "key_wg", blocks, lf)


def test_the_wgmma_key_kernel_matches_float64_past_t_4096(monkeypatch):
    """The wgmma keyq at T 4,100 (causal; past CONFIG["key_lf"]'s 4,096, the LF twin's T, and past the
    last whole tile), LF from T 4,096 and never, bf16 and fp16: O, dQ, dK, dV within the format's
    tolerance of one float64 reference (8 s on a CPU core)."""
    from smallem.backends.cuda import attention_mma

    if not attention_mma.sm90a():
        pytest.skip("keyq by wgmma needs modules compiled for sm_90a (a compute-capability-9.0 device)")
    rng = np.random.default_rng(4100)
    xs = [rng.normal(size=(1, 4100, 2, 64)) for _ in range(4)]
    ref = reference(*(x.swapaxes(1, 2) for x in xs), True)
    monkeypatch.setitem(attention_mma.CONFIG, "staged", {w: (0, 0) for w in attention_mma.WIDTHS})
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], 64: 1})
    for precision, lf in (("bf16", 4096), ("fp16", 4096), ("bf16", 0)):
        monkeypatch.setitem(attention_mma.CONFIG, "key_lf", {**attention_mma.CONFIG["key_lf"], 64: lf})
        got, kernels_ran = run(get_backend("gpu", precision), [x.astype(np.float32) for x in xs], True)
        assert kernels_ran == (True, True)
        errors = [rel(a, r) for a, r in zip(got, ref)]
        print("T 4,100", precision, lf, [f"{e:.2e}" for e in errors])
        assert all(np.isfinite(a).all() for a in got)
        assert tolerance("fp32") * 10 < max(errors) <= tolerance(precision), (precision, lf, errors)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("opts", [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (1, 1, 1), (0, 0, 1)])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (1, 600, 600, 3, 64, True),
    (2, 130, 70, 2, 64, False), (1, 100, 300, 2, 64, False), (1, 200, 200, 2, 128, True),
    (3, 37, 37, 1, 16, True), (1, 2, 2, 1, 32, True)])
def test_the_forward_s_round_10_switches_match_float64(precision, opts, b, t, s, h, d, causal, monkeypatch):
    """CONFIG["forward_opts"] (round 10): the grid (B·H, query blocks) (LF), O rescaled only where
    a row's max moved (LZ), the products by wgmma at D 64 (WG, the softmax overlapping the last
    tile's P V; where the modules are sm_90a's, else mma_forward): O, dQ, dK, dV within the
    format's tolerance (the copies of O: the defaults' tests in tests/gpu/test_halves.py)."""
    from smallem.backends.cuda import attention_mma

    monkeypatch.setitem(attention_mma.CONFIG, "forward_opts", {w: opts for w in attention_mma.WIDTHS})
    _matches_float64(precision, (b, t, s, h, d, causal), t * d + 4, "forward_opts", opts)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("b, t, s, h, d, causal", [
    (2, 64, 64, 4, 64, True), (1, 257, 257, 2, 64, True), (1, 600, 600, 3, 64, True),
    (2, 130, 70, 2, 64, False), (1, 100, 300, 2, 64, False), (1, 2, 2, 1, 64, True),
    (1, 1000, 1000, 2, 64, True), (1, 700, 900, 1, 64, False), (1, 2048, 2048, 1, 64, True)])
def test_the_long_sequences_forward_matches_float64(precision, b, t, s, h, d, causal, monkeypatch):
    """The forward of CONFIG["forward_wg"] (round 13: 128-query x 64-key tiles, Q from shared
    memory, the K/V ring by bulk copies on mbarriers), run at every T here (forward_wg_from 0; the
    threshold's dispatch: test_attention_kernels.py): O, dQ, dK, dV within the format's tolerance,
    causal and not, T ≠ S both ways, T not a multiple of the query tile (rows before 0 in the
    first), one query tile and many, one key tile and more than the ring's 3."""
    from smallem.backends.cuda import attention_mma

    if not attention_mma.sm90a():
        pytest.skip("the wgmma forward needs modules compiled for sm_90a (a compute-capability-9.0 device)")
    monkeypatch.setitem(attention_mma.CONFIG, "forward_wg_from", {d: 0})
    kinds, made = [], attention_mma.mma_kernel
    monkeypatch.setattr(attention_mma, "mma_kernel", lambda kind, *a: kinds.append(kind) or made(kind, *a))
    _matches_float64(precision, (b, t, s, h, d, causal), t * d + 6, "forward_wg")
    assert kinds.count("forwardwg") == 1 and kinds.count("convertsw") == 2 and "forward" not in kinds
    assert kinds.count("convert") == 1  # dO's: Q's rows are the forward's (round 14)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("t, d, wgq", [(300, 64, False), (2049, 64, True), (4096, 64, True),
                                       (130, 64, True), (257, 128, False), (37, 16, False)])
def test_the_forward_keeps_q_s_rows_as_q_s_convert_makes_them(precision, t, d, wgq, monkeypatch):
    """Round 14: the forward stores the 16-bit rows of Q it rounds anyway (the backward's key kernel
    reads them: Q's convert is gone). They are the convert's bits (to_rows: the head's (Tp, D) rows)
    up to the last row a key kernel's query tile reads, zeros past T; and a fwd + bwd launches
    converts for K and V (forward) and dO (backward) only."""
    from smallem.autodiff.attention import Attention
    from smallem.backends.cuda import attention, attention_mma

    if d == 64 and not attention_mma.sm90a():
        pytest.skip("the wgmma forwards need modules compiled for sm_90a (a compute-capability-9.0 device)")
    monkeypatch.setitem(attention_mma.CONFIG, "forward_wg_from", {64: 0 if wgq else 1 << 30})
    kinds, made = [], attention_mma.mma_kernel
    monkeypatch.setattr(attention_mma, "mma_kernel", lambda kind, *a: kinds.append(kind) or made(kind, *a))
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(t + d)
    q, k, v, g = (be.tensor(rng.normal(size=(1, t, 2, d))).transpose(0, 2, 1, 3) for _ in range(4))
    op = Attention(causal=True)
    out = attention.attention_forward(be, q, k, v, op)
    assert len(op.saved) == 2, "the forward kept no Q rows"
    kept = op.saved[1].get().reshape(2, attention_mma.padded(t), d)
    want = attention_mma.to_rows(q, precision, (1, 2)).get().reshape(kept.shape)
    rows = -(-t // 64) * 64  # the key kernels' query tiles (64, or 32 at D 128) end here at most
    np.testing.assert_array_equal(kept[:, :rows], want[:, :rows])
    assert not kept[:, t:rows].any()
    kinds.clear()
    dq, dk, dv = attention.attention_rule(be, g, out, q, k, v, op)
    assert [x for x in kinds if x.startswith("convert")] == ["convert"]  # dO's (δ, dQ's zeros) alone
    ref = reference(*(be.to_numpy(x).astype(np.float64) for x in (q, k, v, g)), True)
    errors = [rel(be.to_numpy(a), r) for a, r in zip((out, dq, dk, dv), ref)]
    assert max(errors) <= tolerance(precision), errors


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_long_sequences_forward_writes_o_s_copy(precision, monkeypatch):
    """With copies asked for, the forward of CONFIG["forward_wg"] writes O's 16-bit copy: the CPU's
    rounding of O, laid out as its (B, T, H, D) memory, causal and not, T past the last tile."""
    import ml_dtypes

    from smallem.autodiff.attention import Attention
    from smallem.backends.cuda import attention, attention_mma, halves
    from smallem.backends.precision import round_to

    if not attention_mma.sm90a():
        pytest.skip("the wgmma forward needs modules compiled for sm_90a (a compute-capability-9.0 device)")
    monkeypatch.setitem(attention_mma.CONFIG, "forward_wg_from", {64: 0})
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(7)
    for t, causal in ((300, True), (450, False)):
        q, k, v = (be.tensor(rng.normal(size=(2, t, 3, 64))).transpose(0, 2, 1, 3) for _ in range(3))
        out = attention.attention_forward(be, q, k, v, Attention(causal=causal, copies=True))
        half = halves.lookup(out.base, precision)
        assert half is not None, "no 16-bit copy of O was registered"
        bits = half.get().view(np.uint16).view(ml_dtypes.bfloat16 if precision == "bf16" else np.float16)
        want = round_to(out.base.get(), precision)
        np.testing.assert_array_equal(bits.astype(np.float32).reshape(-1).view(np.uint32),
                                      want.reshape(-1).view(np.uint32))


def test_a_width_the_kernels_do_not_take_declines_to_the_tiles():
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(2, 40, 2, 8)) for _ in range(4)]
    got, kernels = run(get_backend("gpu"), xs, True)
    assert kernels == (False, False)
    ref = reference(*(x.swapaxes(1, 2) for x in xs), True)
    assert all(rel(a, r) < 1e-5 for a, r in zip(got, ref))


@pytest.mark.parametrize("precision, float32, d, key_wg", [
    ("fp32", "rows", 32, 0), ("fp32", "flash", 32, 0), ("fp32", "flash", 128, 0), ("bf16", "rows", 32, 0),
    ("bf16", "rows", 64, 0), ("bf16", "rows", 64, 1), ("fp16", "rows", 64, 1)])
def test_captured_attention_replays_with_new_inputs(precision, float32, d, key_wg, monkeypatch):
    """A captured forward and backward replayed on new inputs: within the precision's bound of
    float64 (the bf16/fp16 rows at D 64: the tiled keyq, and the wgmma keyq where the modules are
    sm_90a's)."""
    import cupy

    from smallem.backends.cuda import attention as kernels
    from smallem.backends.cuda import attention_mma

    monkeypatch.setattr(kernels, "FLOAT32", float32)
    monkeypatch.setitem(attention_mma.CONFIG, "key_wg", {**attention_mma.CONFIG["key_wg"], 64: key_wg})
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(1)
    bufs = [cupy.asarray(rng.normal(size=(2, 4, 128, d)), dtype=np.float32) for _ in range(4)]
    be.synchronize()
    stream = cupy.cuda.Stream()
    with be.capture(stream) as graph:
        tape = Tape(be)
        leaves = [tape.leaf(x) for x in bufs[:3]]
        y = attention(tape, *leaves)
        grads = tape.backward(y, grad=bufs[3])
        outs = [y.value] + [grads[x] for x in leaves]
    for x in bufs:
        x[...] = cupy.asarray(rng.normal(size=x.shape), dtype=np.float32)
    graph[0].launch(stream=stream)
    stream.synchronize()
    ref = reference(*(cupy.asnumpy(x).astype(np.float64) for x in bufs), True)
    bound = 1e-5 if precision == "fp32" else tolerance(precision)
    assert all(rel(cupy.asnumpy(a), r) < bound for a, r in zip(outs, ref))


@pytest.mark.parametrize("kw", [{"attention": "unfused"}, {"attention": "auto"},
                                {"attention": "fused", "checkpoint_blocks": True}])
def test_the_transformer_holds_the_same_bytes_on_gpu_and_cpu(kw):
    """The CPU tape records each Linear as the GPU's does (one `linear` node, where the GPU adds
    the bias in the product's epilogue; one `linear_add` where the product adds the residual
    too): a CPU backend of its own declaring those fused forwards (they decline, the reference
    computes them)."""
    from smallem.backends.numpy import NumpyBackend

    cpu_backend = NumpyBackend("float32")
    fused = [n for n in ("linear", "linear_add", "qkv_attention")
             if n in get_backend("gpu").fused_forward]
    cpu_backend.fused_forward = {**cpu_backend.fused_forward, **{n: (lambda *args: None) for n in fused}}
    cpu_backend.on_request = frozenset()  # as the GPU: every Linear records its fused node unasked
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64))
    reports, grads = {}, {}
    for name, be in (("gpu", get_backend("gpu")), ("cpu", cpu_backend)):
        cfg = dict(kw, attention="fused") if kw["attention"] == "auto" and name == "cpu" else kw
        model = Transformer(TransformerConfig(**cfg), be, seed=0)
        tape = Tape(be)
        g = tape.backward(model.loss(tape, x, y))
        reports[name] = tape.memory()
        grads[name] = [be.to_numpy(p.grad(g)) for p in model.parameters()]
    gpu, cpu = reports["gpu"], reports["cpu"]
    assert {"linear", "linear_add"} <= set(fused)
    kept = ["linear"] + ([] if kw.get("checkpoint_blocks") else ["linear_add"])  # blocks keep no nodes
    assert all(op in gpu.by_op and op in cpu.by_op for op in kept)
    assert (gpu.kept, gpu.peak, gpu.by_op) == (cpu.kept, cpu.peak, cpu.by_op)
    for a, b in zip(grads["gpu"], grads["cpu"]):
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())


def test_a_captured_step_with_fused_attention_and_checkpointed_blocks_is_the_plain_one():
    from smallem.optim import AdamW
    from smallem.training.step import make_step

    be = get_backend("gpu")
    cfg = TransformerConfig(attention="auto", checkpoint_blocks=True)
    captured, plain = Transformer(cfg, be, seed=0), Transformer(cfg, be, seed=0)
    step = make_step(be, captured, AdamW(lr=1e-3))
    reference_step = make_step(be, plain, AdamW(lr=1e-3), capture=False)
    rng = np.random.default_rng(3)
    for _ in range(5):
        x, y = rng.integers(0, 257, (8, 64)), rng.integers(0, 257, (8, 64))
        a, b = be.item(step(x, y)), be.item(reference_step(x, y))
        assert abs(a - b) < 1e-5
    assert step.graph is not None and step.failed is None
