"""The float32 CPU's fused attention (backends/cpu/attention.py): the float64 reference's values
and gradients to float32 tolerances, the same bits on one thread or three, and what it declines."""

import importlib.util

import numpy as np
import pytest

from smallem.autodiff import Tape, attention
from smallem.backends import get_backend
from smallem.backends.cpu import attention as cpu_attention
from smallem.backends.cpu import compiled, team

CPU = get_backend("cpu")
NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")


def _run(backend, raw, grad, causal, spy=None):
    """O, dQ, dK, dV of attention on (B, H, T, D) views of (B, T, H, D) arrays, as the heads'
    split gives them."""
    dtype = np.float32 if backend == "cpu" else np.float64
    tape = Tape(backend)
    leaves = [tape.leaf(r.astype(dtype).transpose(0, 2, 1, 3)) for r in raw]
    out = attention(tape, *leaves, causal=causal)
    grads = tape.backward(out, grad=np.asarray(grad, dtype))  # a float32 view stays one
    return [np.asarray(out.value)] + [np.asarray(grads[x]) for x in leaves]


def _route(monkeypatch, route):
    """numpy: NumPy's calls; numba-rowsN: the compiled blocks with their products in BLAS
    (cpu/compiled_attention.py), N queries a product (4: T = 17 in five pieces); numba-loops:
    compiled_kernels' own loops (where NumPy's BLAS cannot be called)."""
    monkeypatch.setenv("SMALLEM_KERNELS", route.split("-")[0])
    if route.startswith("numba"):
        monkeypatch.setattr(compiled, "_blas", [False] if route == "numba-loops" else [])
        if route.startswith("numba-rows"):
            blas = compiled.attention_blas()
            assert blas, "NumPy's OpenBLAS is there in this environment: the BLAS route must run"
            monkeypatch.setattr(blas, "ROWS", int(route.split("rows")[1]))


ROUTES = ["numpy"] + [pytest.param(r, marks=NUMBA) for r in ("numba-rows4", "numba-rows32",
                                                              "numba-loops")]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("causal, spread", [(True, 1.0), (False, 1.0), (True, 4.0), (False, 4.0)])
def test_matches_float64_and_is_the_same_bits_on_any_team(monkeypatch, causal, spread, route):
    """spread 4: scores far apart (over numpy_fused.SPREAD), each row shifted by its own max.
    route: see _route."""
    _route(monkeypatch, route)
    rng = np.random.default_rng(3)
    b, h, t, d = 9, 3, 17, 5
    raw = [rng.normal(size=(b, t, h, d)) * (spread if i < 2 else 1.0) for i in range(3)]
    grad = rng.normal(size=(b, h, t, d))
    calls = []
    for table, name in ((CPU.fused_forward, "attention_forward"), (CPU.fused, "attention_rule")):
        kernel = getattr(cpu_attention, name)
        monkeypatch.setitem(table, "attention", lambda *a, k=kernel, n=name: calls.append(n) or k(*a))
    reference = _run("cpu64", raw, grad, causal)
    monkeypatch.setattr(cpu_attention, "BLOCK", h * t * t * 2)  # blocks of two sequences: five
    before, mine = team.size(), []
    try:
        for n in (1, 3):
            team.resize(n)
            mine.append(_run("cpu", raw, grad, causal))
    finally:
        team.resize(before)
    assert calls == ["attention_forward", "attention_rule"] * 2  # the kernels ran, not the reference
    for one, three, want in zip(*mine, reference):
        assert one.dtype == np.float32 and np.array_equal(one, three)
        np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_declines_what_it_does_not_take():
    q = np.zeros((2, 3, 4, 5), np.float32)
    op = type("Op", (), {"causal": True, "factor": lambda self, d: 1.0, "saved": ()})()
    assert cpu_attention.attention_forward(CPU, q.astype(np.float64), q, q, op) is None  # float64
    assert cpu_attention.attention_forward(CPU, q, q[..., :3, :], q[..., :3, :], op) is None  # T ≠ S
    assert cpu_attention.attention_forward(CPU, q[..., ::2], q[..., ::2], q[..., ::2], op) is None
    assert cpu_attention.attention_rule(CPU, q, q, q, q, q, op) is None  # no lse saved


@NUMBA
def test_the_blas_route_declines_rows_it_cannot_hand_to_blas(monkeypatch):
    """A gradient broadcast along T (row stride 0) is not a matrix BLAS can read: the compiled
    loops take it, with the NumPy route's numbers."""
    from smallem.backends.cpu import compiled_attention

    rng = np.random.default_rng(5)
    b, h, t, d = 2, 3, 9, 4
    q, k, v = (rng.normal(size=(b, t, h, d)).astype(np.float32).transpose(0, 2, 1, 3) for _ in "qkv")
    grad = np.broadcast_to(rng.normal(size=(1, 1, 1, d)).astype(np.float32), (b, h, t, d))
    assert not compiled_attention.ready(grad) and compiled_attention.ready(q, k, v)
    results = []
    for route in ("numpy", "numba-rows4"):
        _route(monkeypatch, route)
        op = type("Op", (), {"causal": True, "factor": lambda self, d: d ** -0.5, "saved": ()})()
        out = cpu_attention.attention_forward(CPU, q, k, v, op)
        if route != "numpy":
            calls = []
            monkeypatch.setattr(compiled.attention_blas(), "attention_rule",
                                lambda *a: calls.append(a))
        results.append(cpu_attention.attention_rule(CPU, grad, out, q, k, v, op))
    assert calls == []  # the BLAS rule was not asked
    for mine, want in zip(*results):
        np.testing.assert_allclose(mine, want, rtol=1e-4, atol=1e-6)
