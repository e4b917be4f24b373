"""A Linear on the GPU (backends/cuda/linear.py): one cuBLASLt product whose epilogue adds the
bias, its rule with the bias gradient by a column sum (the default) or summed by the weight
gradient's product (BGRADA, selectable), in every precision, against float64 on the inputs the
precision's products read; recorded in a graph and replayed on new values. Skipped, with the
reason, where CuPy sees no device."""

import numpy as np
import pytest

from smallem import Tape
from smallem.backends import get_backend, gpu_available
from smallem.backends.precision import get_format, round_to
from smallem.nn import Linear

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="no CUDA device visible to CuPy")]
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
SHAPES = [((4, 16, 48), 40), ((37, 24), 33), ((2, 300, 64), 256)]  # (B, T, C), (B, C), 600 rows


def _tolerance(precision):
    return 2e-5 if precision == "fp32" else 4 * get_format(precision).eps


def _reference(x, w, b, up, precision):
    """float64 on what the products read: x, W and dy rounded to the precision (the tape's CPU
    policy); db = Σ dy as the product reads it, and Σ |dy| to scale its tolerance."""
    r = lambda a: round_to(a, precision).astype(np.float64)  # noqa: E731
    rows_x, rows_up = x.reshape(-1, x.shape[-1]), up.reshape(-1, up.shape[-1])
    y = r(x) @ r(w) + b
    dx = r(up) @ r(w).T
    dw = r(rows_x).T @ r(rows_up)
    return y, dx.reshape(x.shape), dw, rows_up.sum(0), np.abs(rows_up).sum(0)


@pytest.mark.parametrize("bgrad", [True, False], ids=["bgrad", "column-sum"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape, out", SHAPES, ids=["BTC", "BC-odd", "600-rows"])
def test_linear_runs_fused_with_its_epilogues_and_matches_float64(precision, shape, out, bgrad,
                                                                  monkeypatch):
    from smallem.backends.cuda import linear

    monkeypatch.setattr(linear, "BGRAD", (precision,) if bgrad else ())
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(3)
    x, up = rng.normal(size=shape), rng.normal(size=shape[:-1] + (out,))
    layer = Linear(shape[-1], out, backend=be, rng=np.random.default_rng(4))
    layer.bias.assign(rng.normal(size=out))
    tape = Tape(be)
    xv = tape.leaf(x)
    y = layer(tape, xv)
    assert tape.nodes[y.index].op == "linear"
    steps = list(tape.backward_steps(tape.sum(tape.mul(y, tape.constant(up)))))
    assert any(s.op == "linear" and s.fused for s in steps)
    g = tape.gradients
    w, b = layer.weight.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64)
    y64, dx64, dw64, db64, db_scale = _reference(x.astype(np.float32), w, b, up.astype(np.float32),
                                                 precision)
    tol = _tolerance(precision)
    for got, want in ((y.value, y64), (g[xv], dx64), (layer.weight.grad(g), dw64)):
        got = be.to_numpy(got).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    # db: the sum the epilogue makes (of dy as its product reads it, in bf16/fp16 its 16-bit copy)
    # is within the format's eps of Σ|dy| of the exact sum, whichever of the two it reads
    db = be.to_numpy(layer.bias.grad(g)).astype(np.float64)
    bound = (1e-5 if precision == "fp32" else 2 * get_format(precision).eps) * db_scale + 1e-5
    assert np.all(np.abs(db - db64) <= bound), np.abs(db - db64).max()
    plans = {key[-1]: plan for key, plan in be._gemm.lt.plans.items() if key[-1]}
    print(precision, shape, {name: plan is not None for name, plan in plans.items()})
    assert plans.get("bias") is not None, "cuBLASLt refused the bias epilogue"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_recorded_linear_replays_on_new_values(precision):
    """Forward and rule recorded in a graph (the bias pointer and the bias gradient's buffer
    frozen into it), replayed after new x, dy and bias were copied into the same buffers."""
    import cupy

    from smallem.backends.cuda import halves
    from smallem.backends.cuda.linear import linear_forward, linear_rule

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(6)
    x, w, b, up = (be.tensor(rng.normal(size=s)) for s in ((3, 40, 32), (32, 24), (24,), (3, 40, 24)))
    run = lambda: (linear_forward(be, x, w, b, None), *linear_rule(be, up, None, x, w, b, None))  # noqa: E731
    run()  # plans made, dy's 16-bit copy registered
    stream = cupy.cuda.Stream()
    with be.capture(stream) as graph:
        outs = run()
    for buf in (x, b, up):
        buf[...] = be.tensor(rng.normal(size=buf.shape))
    copy = halves.lookup(up, precision) if halves.wanted(precision) else None
    if copy is not None:  # a graph reads dy's copy as dy's producer wrote it: here, the test
        copy[...] = halves.rounded(up + 0, precision)
    graph[0].launch(stream=stream)
    stream.synchronize()
    plain = run()
    for got, want in zip(outs, plain):
        np.testing.assert_allclose(cupy.asnumpy(got), cupy.asnumpy(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape, out", SHAPES, ids=["BTC", "BC-odd", "600-rows"])
def test_linear_with_a_residual_is_one_product_reading_it_and_matches_float64(precision, shape, out):
    """r + x·W + b as one cuBLASLt product (r read as C, beta 1; b by the epilogue); its rule the
    Linear's, and dr = dy. float64 on what the products read; r is added in float32."""
    be = get_backend("gpu", precision)
    rng = np.random.default_rng(13)
    x, up = rng.normal(size=shape), rng.normal(size=shape[:-1] + (out,))
    r = rng.normal(size=shape[:-1] + (out,))
    layer = Linear(shape[-1], out, backend=be, rng=np.random.default_rng(4))
    layer.bias.assign(rng.normal(size=out))
    tape = Tape(be)
    xv, rv = tape.leaf(x), tape.leaf(r)
    y = layer(tape, xv, residual=rv)
    assert tape.nodes[y.index].op == "linear_add"
    steps = list(tape.backward_steps(tape.sum(tape.mul(y, tape.constant(up)))))
    assert any(s.op == "linear_add" and s.fused for s in steps)
    g = tape.gradients
    w, b = layer.weight.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64)
    y64, dx64, dw64, db64, db_scale = _reference(x.astype(np.float32), w, b, up.astype(np.float32),
                                                 precision)
    y64 = y64 + r.astype(np.float32)
    tol = _tolerance(precision)
    for got, want in ((y.value, y64), (g[xv], dx64), (layer.weight.grad(g), dw64),
                      (g[rv], up.astype(np.float32))):
        got = be.to_numpy(got).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))
    db = be.to_numpy(layer.bias.grad(g)).astype(np.float64)
    bound = (1e-5 if precision == "fp32" else 2 * get_format(precision).eps) * db_scale + 1e-5
    assert np.all(np.abs(db - db64) <= bound), np.abs(db - db64).max()
    assert any(key[-2] and plan is not None for key, plan in be._gemm.lt.plans.items()), \
        "cuBLASLt refused the product with C"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_recorded_linear_with_a_residual_replays_on_new_values(precision):
    """The forward recorded in a graph (r's pointer frozen into it), replayed after new x and r
    were copied into the same buffers: the plain call's numbers."""
    import cupy

    from smallem.backends.cuda.linear import linear_add_forward

    be = get_backend("gpu", precision)
    rng = np.random.default_rng(7)
    x, w, b, r = (be.tensor(rng.normal(size=s)) for s in ((3, 40, 32), (32, 24), (24,), (3, 40, 24)))
    linear_add_forward(be, x, w, b, r, None)  # the plan made
    stream = cupy.cuda.Stream()
    with be.capture(stream) as graph:
        out = linear_add_forward(be, x, w, b, r, None)
    for buf in (x, r):
        buf[...] = be.tensor(rng.normal(size=buf.shape))
    graph[0].launch(stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(out), cupy.asnumpy(linear_add_forward(be, x, w, b, r, None)),
                               rtol=1e-5, atol=1e-5)
