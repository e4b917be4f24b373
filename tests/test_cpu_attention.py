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
        monkeypatch.setattr(cpu_attention, "BLOCK", h * t * t)  # one sequence a block: nine (other
        mine.append(_run("cpu", raw, grad, causal))  # bits: NumPy's stacked products by count)
    finally:
        team.resize(before)
    assert calls == ["attention_forward", "attention_rule"] * 3  # the kernels ran, not the reference
    for one, three, by_one, want in zip(*mine, reference):
        assert one.dtype == np.float32 and np.array_equal(one, three)
        for got in (one, by_one):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()))


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


def _pool_jobs(monkeypatch, jobs, spy):
    """The compiled BLAS blocks, the pool asked for from 2 threads, its attention jobs on (1) or
    off (0); `spy` collects the job kinds the pool is handed."""
    from smallem.backends.cpu import linear

    _route(monkeypatch, "numba-rows4")
    monkeypatch.setenv(linear.POOL_ENV, "1")
    monkeypatch.setenv(linear.POOL_JOBS_ENV, jobs)
    pool = linear._pool()
    if pool is not None and not hasattr(pool.publish_job, "spied"):
        publish = pool.publish_job

        def spied(helpers, values, kind, cuts):
            spy.append(kind)
            return publish(helpers, values, kind, cuts)
        spied.spied = True
        monkeypatch.setattr(pool, "publish_job", spied)


@NUMBA
@pytest.mark.parametrize("causal", [True, False])
def test_the_pools_attention_jobs_are_team_runs_bits_on_1_3_and_16_threads(monkeypatch, causal):
    """SMALLEM_POOL_JOBS=1: the compiled blocks taken by the pool's helpers inside their loop
    (compiled_jobs.py) give the bits of the same blocks through team.run, on 1, 3 and 16 threads."""
    from smallem.backends.cpu import compiled_team

    rng = np.random.default_rng(21)
    b, h, t, d = 9, 3, 17, 5
    raw = [rng.normal(size=(b, t, h, d)) for _ in range(3)]
    grad = rng.normal(size=(b, h, t, d))
    monkeypatch.setattr(cpu_attention, "BLOCK", h * t * t * 2)  # blocks of two sequences: five
    before, kinds = team.size(), []
    try:
        team.resize(3)
        _pool_jobs(monkeypatch, "0", kinds)
        want = _run("cpu", raw, grad, causal)
        assert kinds == []
        got = {}
        for n in (1, 3, 16, 3):
            team.resize(n)
            _pool_jobs(monkeypatch, "1", kinds)
            got[n] = _run("cpu", raw, grad, causal)
    finally:
        team.resize(before)
    # the pool ran both kernels on 3 and 16 threads (twice on 3); one thread has no pool
    assert kinds == [compiled_team.ATTENTION_FORWARD, compiled_team.ATTENTION_RULE] * 3
    for n, mine in got.items():
        for one, other in zip(mine, want):
            assert np.array_equal(one, other), n


@NUMBA
def test_the_pools_attention_jobs_keep_their_bits_between_numpy_jobs_linears_and_resizes(monkeypatch):
    """The first step's stress pattern for the new jobs: many attention jobs on the pool with the
    team's NumPy runs, the pool's Linears and resizes between, every one team.run's bits."""
    from smallem.autodiff.operations import Linear
    from smallem.backends.cpu import linear

    rng = np.random.default_rng(22)
    b, h, t, d = 6, 2, 9, 4
    raw = [rng.normal(size=(b, t, h, d)) for _ in range(3)]
    grad = rng.normal(size=(b, h, t, d))
    x, w = rng.normal(size=(300, 24)).astype(np.float32), rng.normal(size=(24, 40)).astype(np.float32)
    bias, g = rng.normal(size=40).astype(np.float32), rng.normal(size=(300, 40)).astype(np.float32)
    monkeypatch.setattr(cpu_attention, "BLOCK", h * t * t)  # one sequence a block: six
    from smallem.backends.cpu import products

    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)
    before, kinds = team.size(), []
    try:
        team.resize(3)
        _pool_jobs(monkeypatch, "0", kinds)
        want = _run("cpu", raw, grad, True)
        want_linear = linear.linear_rule(CPU, g, None, x, w, bias, Linear())
        _pool_jobs(monkeypatch, "1", kinds)
        for turn in range(40):
            if turn in (13, 27):
                team.resize(1 if turn == 13 else 4)
                _pool_jobs(monkeypatch, "1", kinds)
            if turn % 3 == 0:
                assert team.run(lambda i: i * i, list(range(8))) == [i * i for i in range(8)]
            if turn % 4 == 1:
                got = linear.linear_rule(CPU, g, None, x, w, bias, Linear())
                assert all(np.array_equal(p, q) for p, q in zip(got, want_linear))
            assert all(np.array_equal(p, q) for p, q in zip(_run("cpu", raw, grad, True), want)), turn
    finally:
        team.resize(before)
    assert len(kinds) == 2 * (40 - 14)  # turns 13-26 ran on one thread: no pool


def test_pool_jobs_are_on_where_the_pool_runs_unless_turned_off_and_a_bad_value_is_one_sentence(
        monkeypatch):
    from smallem.backends.cpu import linear
    from smallem.errors import SmallemError

    monkeypatch.setenv(linear.POOL_ENV, "1")
    before = team.size()
    try:
        team.resize(3)
        monkeypatch.delenv(linear.POOL_JOBS_ENV, raising=False)
        numba = importlib.util.find_spec("numba") is not None
        assert linear.POOL_JOBS == "1" and (linear.jobs_pool() is linear._pool()) == numba
        monkeypatch.setenv(linear.POOL_JOBS_ENV, "0")
        assert linear.jobs_pool() is None
        if importlib.util.find_spec("numba") is not None:
            monkeypatch.setenv(linear.POOL_JOBS_ENV, "1")
            assert linear.jobs_pool() is linear._pool() is not None
        monkeypatch.setattr(linear.compiled, "linear", lambda: None)  # no numba, or SMALLEM_LINEAR=numpy
        assert linear.jobs_pool() is None  # (AdamW asks on every backend: no compiled_team import)
        for bad in ("yes", "2", "attention"):
            monkeypatch.setenv(linear.POOL_JOBS_ENV, bad)
            with pytest.raises(SmallemError, match="SMALLEM_POOL_JOBS=.*: give 1 .* or 0"):
                linear.jobs_pool()
    finally:
        team.resize(before)
