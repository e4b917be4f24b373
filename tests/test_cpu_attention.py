"""The float32 CPU's fused attention (backends/cpu/attention.py): the float64 reference's values
and gradients to float32 tolerances, the same bits on one thread or three, and what it declines."""

import importlib.util

import numpy as np
import pytest

from smallem.autodiff import Tape, attention
from smallem.backends import get_backend
from smallem.backends.cpu import attention as cpu_attention
from smallem.backends.cpu import team

CPU = get_backend("cpu")
NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")


def _run(backend, raw, grad, causal, spy=None):
    """O, dQ, dK, dV of attention on (B, H, T, D) views of (B, T, H, D) arrays, as the heads'
    split gives them."""
    dtype = np.float32 if backend == "cpu" else np.float64
    tape = Tape(backend)
    leaves = [tape.leaf(r.astype(dtype).transpose(0, 2, 1, 3)) for r in raw]
    out = attention(tape, *leaves, causal=causal)
    grads = tape.backward(out, grad=grad.astype(dtype))
    return [np.asarray(out.value)] + [np.asarray(grads[x]) for x in leaves]


@pytest.mark.parametrize("route", ["numpy", pytest.param("numba", marks=NUMBA)])
@pytest.mark.parametrize("causal, spread", [(True, 1.0), (False, 1.0), (True, 4.0), (False, 4.0)])
def test_matches_float64_and_is_the_same_bits_on_any_team(monkeypatch, causal, spread, route):
    """spread 4: scores far apart (over numpy_fused.SPREAD), each row shifted by its own max.
    route: NumPy's calls, or numba's compiled blocks (cpu/compiled.py)."""
    monkeypatch.setenv("SMALLEM_KERNELS", route)
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
