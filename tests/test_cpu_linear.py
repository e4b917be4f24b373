"""The float32 CPU engine's Linear layer (backends/cpu/linear.py) and numba's exact passes
(compiled_passes.py): the fused forward and rule give the unfused engine's bits (product, bias,
residual; dx, dW, db cut as products.py cuts them), within float32's bounds of float64, the same
bits on one thread or three, on the NumPy route and numba's; AdamW's compiled loop the NumPy
passes' bits."""

import importlib.util

import numpy as np
import pytest

from smallem.autodiff.operations import Linear, LinearAdd
from smallem.autodiff.tape import Tape, unbroadcast
from smallem.backends import get_backend
from smallem.backends.array import ArrayBackend
from smallem.backends.cpu import compiled, linear, products, team
from smallem.nn import Linear as LinearLayer
from smallem.nn import built_for_speed

CPU = get_backend("cpu")
EPS = float(np.finfo(np.float32).eps)
NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")
# numba's table with each Linear's pieces as compiled calls into NumPy's OpenBLAS
# (compiled_linear.py) through team.share, or on the spinning pool (compiled_team.py,
# SMALLEM_POOL=1), or with the Linear's pieces as NumPy calls (SMALLEM_LINEAR=numpy)
ROUTES = ["numpy", pytest.param("numba", marks=NUMBA), pytest.param("numba, pool", marks=NUMBA),
          pytest.param("numba, NumPy's Linear", marks=NUMBA)]


@pytest.fixture(params=ROUTES)
def route(request, monkeypatch):
    kernels, _, linear_route = request.param.partition(", ")
    monkeypatch.setenv(compiled.ENV, kernels)
    monkeypatch.setenv(compiled.LINEAR_ENV, "numpy" if linear_route == "NumPy's Linear" else "numba")
    monkeypatch.setenv(linear.POOL_ENV, "1" if linear_route == "pool" else "0")
    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)  # small shapes cut into many pieces
    monkeypatch.setattr(products, "MIN_ITEMS", 1 << 8)
    before = team.size()
    yield request.param
    team.resize(before)


def on_teams(fn):
    out = []
    for n in (1, 3):
        team.resize(n)
        out.append(fn())
    return out


def compiled_linears(monkeypatch, pool: str | None = None) -> None:
    """The compiled route for the table and the Linears, products cut from 4,096 MACs (small data
    then runs in pieces), and SMALLEM_POOL when given: the pool tests' common setup."""
    monkeypatch.setenv(compiled.ENV, "numba")
    monkeypatch.setenv(compiled.LINEAR_ENV, "numba")
    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)
    if pool is not None:
        monkeypatch.setenv(linear.POOL_ENV, pool)


def data(rows=(7, 61), k=24, n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(*rows, k)).astype(np.float32)
    w, b = rng.normal(size=(k, n)).astype(np.float32), rng.normal(size=n).astype(np.float32)
    r, g = (rng.normal(size=(*rows, n)).astype(np.float32) for _ in range(2))
    return x, w, b, r, g


def test_the_forward_is_the_references_bits_on_any_team(route):
    x, w, b, r, _ = data()
    for fused, reference in ((lambda: linear.linear_forward(CPU, x, w, b, Linear()),
                              lambda: Linear().forward(CPU, x, w, b)),
                             (lambda: linear.linear_add_forward(CPU, x, w, b, r, LinearAdd()),
                              lambda: LinearAdd().forward(CPU, x, w, b, r))):
        one, three = on_teams(fused)
        assert one is not None and one.shape == (7, 61, 40)
        assert np.array_equal(one, three) and np.array_equal(one, reference())


# dW as products.matmul cuts xᵀ·dy: whole (few rows, short K), by slices of many rows summed in
# order, by rows of xᵀ (a long K), by slices again where the rows are 4 K or more (products.long_sum);
# dy (B, T, N) or (rows, N)
SHAPES = [((7, 61), 24, 40), ((5, 300), 24, 40), ((7, 61), 300, 40), ((1500,), 24, 40),
          ((4, 1100), 260, 40)]
IDS = ["whole", "sum of slices", "rows of xT", "2-D", "sum of slices, long K"]


@pytest.mark.parametrize("rows, k, n", SHAPES, ids=IDS)
def test_the_rule_matches_float64_in_the_same_bits_on_any_team(route, rows, k, n):
    x, w, b, r, g = data(rows, k, n)
    one, three = on_teams(lambda: linear.linear_add_rule(CPU, g, None, x, w, b, r, LinearAdd()))
    assert all(np.array_equal(p, q) for p, q in zip(one, three))
    dx, dw, db, dr = one
    assert dr is g and dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape
    assert np.array_equal(dx, CPU.matmul(g, w.T))  # the unfused engine's pieces, its bits
    assert np.array_equal(dw, CPU.matmul(x.reshape(-1, k).T, g.reshape(-1, n)))
    assert np.array_equal(db, unbroadcast(CPU, g, (n,)))
    x64, g64 = x.reshape(-1, k).astype(np.float64), g.reshape(-1, n).astype(np.float64)
    rows = x64.shape[0]
    assert (np.abs(dw - x64.T @ g64) <= 2 * rows * EPS * (np.abs(x64).T @ np.abs(g64))).all()
    assert (np.abs(db - g64.sum(0)) <= 2 * rows * EPS * np.abs(g64).sum(0)).all()


def test_it_declines_what_it_cannot_cut_and_the_reference_runs(route):
    x, w, b, r, g = data()
    assert linear.linear_forward(CPU, x[:, ::2], w, b, Linear()) is None  # strided
    assert linear.linear_forward(CPU, x.astype(np.float64), w, b, Linear()) is None
    assert linear.linear_forward(CPU, x[:2, :3], w, b, Linear()) is None  # 6 rows: not cut
    assert linear.linear_add_forward(CPU, x, w, b, r[:, ::-1], LinearAdd()) is None
    assert linear.linear_rule(CPU, g[:, ::2], None, x, w, b, Linear()) is None
    tape = Tape(CPU)  # a small layer on the tape: the reference's product and add, declined
    layer = LinearLayer(24, 40, backend=CPU)
    layer.fast = True
    y = layer(tape, tape.leaf(x[:2, :3]))
    want = Linear().forward(CPU, x[:2, :3], layer.weight.value, layer.bias.value)
    assert tape.nodes[-1].op == "linear" and np.array_equal(y.value, want)


@pytest.mark.parametrize("rows, k, n", SHAPES, ids=IDS)
def test_a_layer_on_the_tape_gives_the_unfused_tapes_bits(route, rows, k, n):
    x, _, _, r, g = data(rows, k, n, seed=3)
    layer = LinearLayer(k, n, backend=CPU, rng=np.random.default_rng(1))
    layer.bias.value[:] = np.random.default_rng(2).normal(size=n)
    layer.fast = True  # asked for: a lesson's layer keeps its matmul and add nodes (below)
    out = []
    for fused in (True, False):
        tape = Tape(CPU, fused=fused)
        xs, rs = tape.leaf(x), tape.leaf(r)
        y = layer(tape, xs, rs)
        grads = tape.backward(y, g)
        out.append([y.value, grads[xs], grads[rs], layer.weight.grad(grads), layer.bias.grad(grads)])
        assert (tape.nodes[-1].op == "linear_add") is fused
    for mine, theirs in zip(*out):
        assert np.array_equal(mine, theirs)


def test_adamw_is_the_numpy_passes_bits_on_either_route_and_team(route):
    rng = np.random.default_rng(1)
    shapes = [(257, 64), (64,), (64, 256), (1,)]
    state = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(4)]
    state[3] = [np.abs(v) for v in state[3]]  # second moments are positive
    settings = dict(steps=[3, 3, 3, 1], lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
                    weight_decays=[0.1, 0.0, 0.1, 0.0])
    reference = [[v.copy() for v in group] for group in state]
    ArrayBackend.adamw_update(CPU, *reference, **settings)
    for n in (1, 3):
        team.resize(n)
        mine = [[v.copy() for v in group] for group in state]
        CPU.adamw_update(*mine, **settings)
        assert all(np.array_equal(p, q) for got, want in zip(mine, reference) for p, q in zip(got, want))


def test_only_a_model_built_for_speed_records_the_fused_node_on_the_cpu():
    """Lesson 15 counts the memory of a float32 tape's matmul and add nodes: a plain layer keeps
    them; bench's CPU rows build their models for speed (every Linear fused)."""
    from smallem.models.transformer import Transformer, TransformerConfig
    from smallem.tools.bench import build

    x, _, _, r, _ = data()
    for fast, ops in ((False, ["matmul", "add", "add"]), (True, ["linear_add"])):
        layer = LinearLayer(24, 40, backend=CPU)
        layer.fast = fast
        tape = Tape(CPU)
        layer(tape, tape.leaf(x), tape.leaf(r))
        assert [n.op for n in tape.nodes if n.op not in ("leaf", None)][-len(ops):] == ops
    config = TransformerConfig(layers=2, width=32, heads=2, context=16, vocab=19)
    model = Transformer(config, CPU)
    assert not any(layer.fast for layer in _linears(model))
    assert all(layer.fast for layer in _linears(built_for_speed(model))) and len(_linears(model)) == 13
    assert all(layer.fast for layer in _linears(build("transformer", CPU, 0, "cpu")))
    assert not any(layer.fast for layer in _linears(build("transformer", CPU, 0, "gpu")))


def test_a_training_run_steps_the_model_bench_times():
    """`smallem train` on the float32 CPU steps the Linears bench's CPU rows time (fused: the
    same numbers as the unfused layers, fewer hand-overs between the team's threads)."""
    from smallem.training.config import TrainConfig, build_model

    assert all(layer.fast for layer in _linears(build_model(TrainConfig(model="transformer"), CPU)))


def _linears(model):
    return [m for blk in model.blocks for m in (blk.attention.query, blk.attention.key,
                                                blk.attention.value, blk.attention.output,
                                                blk.mlp.expand, blk.mlp.contract)] + [model.head]


@NUMBA
def test_the_compiled_linear_runs_where_asked_and_calls_the_blas_held_to_one_thread(monkeypatch):
    """SMALLEM_LINEAR chooses; the sgemm compiled_linear calls is in the library threadpoolctl
    holds to one thread (threads.settle), so a piece never starts BLAS's own threads."""
    from threadpoolctl import threadpool_info

    from smallem.backends.cpu import compiled_linear, threads
    from smallem.errors import SmallemError

    monkeypatch.setenv(compiled.ENV, "numba")
    monkeypatch.setenv(compiled.LINEAR_ENV, "numba")
    assert compiled.linear() and compiled.linear().linear_rule is compiled_linear.linear_rule
    monkeypatch.setenv(compiled.LINEAR_ENV, "numpy")
    assert compiled.linear() is False
    monkeypatch.setenv(compiled.ENV, "numpy")
    monkeypatch.setenv(compiled.LINEAR_ENV, "numba")
    assert compiled.linear() is False  # the NumPy route has no compiled Linear either
    monkeypatch.setenv(compiled.LINEAR_ENV, "fast")
    with pytest.raises(SmallemError, match="SMALLEM_LINEAR='fast': give numba or numpy"):
        compiled.linear()
    from smallem.tools.bench import _cpu_kernels  # what bench's machine line says runs

    monkeypatch.setenv(compiled.ENV, "numba")
    monkeypatch.setenv(compiled.LINEAR_ENV, "numpy")
    assert _cpu_kernels().endswith(", Linears as NumPy calls")
    monkeypatch.setenv(compiled.LINEAR_ENV, "numba")
    assert _cpu_kernels().startswith("numba ") and "Linears" not in _cpu_kernels()
    before = team.size()
    threads.settle()
    team.resize(before)
    mine = [info for info in threadpool_info() if info["internal_api"] == "openblas"
            and _sgemm_address(info["filepath"], compiled_linear.SYMBOLS) == compiled_linear.ADDRESS]
    assert len(mine) == 1 and mine[0]["num_threads"] == 1


def _sgemm_address(path, symbols):
    import ctypes

    lib = ctypes.CDLL(path)
    name = next((s for s in symbols if hasattr(lib, s)), None)
    return name and ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def test_share_gives_every_piece_once_and_raises_a_threads_error_in_the_caller():
    import itertools
    import threading

    before = team.size()
    team.resize(3)
    try:
        taken, lock, counter = [], threading.Lock(), itertools.count()

        def work():  # a compiled loop's stand-in: pieces from a shared counter
            did = 0
            while (i := next(counter)) < 50:
                with lock:
                    taken.append(i)
                did += 1
            return did

        team.share(work, 50)
        assert sorted(taken) == list(range(50))

        def broken():
            raise ValueError("a piece failed")

        with pytest.raises(ValueError, match="a piece failed"):
            team.share(broken, 5)
        team.resize(1)  # one thread: the loop called on the caller, no job (round 15)
        taken.clear()
        counter = itertools.count()
        team.share(work, 50)
        assert sorted(taken) == list(range(50))
        with pytest.raises(ValueError, match="a piece failed"):
            team.share(broken, 5)
    finally:
        team.resize(before)


@NUMBA
@pytest.mark.parametrize("spin_us", [0.0, 200.0])
def test_the_pool_gives_the_shared_runs_bits_between_numpy_jobs(monkeypatch, spin_us):
    """compiled_team's pool (helpers spinning between compiled Linears, recalled to their queues
    for NumPy jobs) gives team.share's bits (SMALLEM_POOL=0), run after run, on 1 and 3 threads,
    with the team's NumPy runs between its jobs and a resize in the middle."""
    compiled_linears(monkeypatch)
    monkeypatch.setattr(products, "MIN_ITEMS", 1 << 8)
    before = team.size()
    x, w, b, r, g = data((5, 300), 24, 40, seed=5)
    calls = (lambda: linear.linear_add_forward(CPU, x, w, b, r, LinearAdd()),
             lambda: linear.linear_rule(CPU, g, None, x, w, b, Linear()))
    try:
        monkeypatch.setenv(linear.POOL_ENV, "0")
        team.resize(3)
        want = [call() for call in calls]
        monkeypatch.setenv(linear.POOL_ENV, "1")
        assert linear._pool() is team._pool and team._pool is not None
        monkeypatch.setattr(team._pool, "spins", int(spin_us * team._pool.default_spins / team.spin_us()))
        for turn in range(60):
            team.resize(1 if turn == 30 else 3)
            got = [call() for call in calls]
            assert np.array_equal(got[0], want[0])
            assert all(np.array_equal(p, q) for p, q in zip(got[1], want[1]))
            if turn % 3 == 0:  # a NumPy job between: helpers leave the pool for their queues
                assert team.run(lambda i: i * i, list(range(8))) == [i * i for i in range(8)]
    finally:
        team.resize(before)


@NUMBA
def test_idle_helpers_wait_in_the_pool_and_a_numpy_job_recalls_only_its_own(monkeypatch):
    """Past its spin a pool helper sleeps inside the compiled loop (Linux's futex), without the
    GIL, where it used to return to Python for its queue after every spin: compiled Linears with
    pauses between wake it there, and it never enters the pool again from Python; a NumPy job on
    one helper recalls that one alone. The bits stay team.share's.

    The test waits for Pool.asleep (round 17): a job or a recall is often done by the caller before
    the helper it woke has run, and that helper reads ASLEEP until it does, then SPINNING or QUEUED,
    then ASLEEP again. Polling WHERE alone, rounds 15-16 saw [0, 2, 2] or [2, 1, 2] in 1 whole-file
    run of 10-30 on the loaded 2-core machine and took it for a helper held up for seconds; round
    17 found it 1 time in 15, and the second states 3-30 s later were those of a settled team."""
    import time

    from smallem.backends.cpu import compiled_team

    if not compiled_team.SLEEPS:
        pytest.skip("no futex on this system: helpers past their spin return to their queues")
    compiled_linears(monkeypatch)
    before = team.size()
    x, w, b, r, _ = data((5, 300), 24, 40, seed=9)
    forward = lambda: linear.linear_add_forward(CPU, x, w, b, r, LinearAdd())  # noqa: E731
    try:
        monkeypatch.setenv(linear.POOL_ENV, "0")
        team.resize(4)
        want = forward()
        monkeypatch.setenv(linear.POOL_ENV, "1")
        pool = linear._pool()
        monkeypatch.setattr(pool, "spins", 0)
        entered = [0] * 3
        serve = pool.serve

        def counted(me, since):
            entered[me] += 1
            serve(me, since)
        monkeypatch.setattr(pool, "serve", counted)
        def asleep() -> list[int]:  # each helper's state once all sleep with no wake-up sent since
            deadline = time.time() + 30  # a loaded machine may not run a woken helper for seconds
            while not all(pool.asleep(i) for i in range(3)) and time.time() < deadline:
                time.sleep(0.01)
            return [pool.where(i) for i in range(3)]

        def where() -> str:  # what a failure shows: each helper's state, queue, recalls, entries
            return (f"queued {[q.qsize() for q in team._inboxes]}, recalled "
                    f"{[pool.recalled(i) for i in range(3)]}, entered {entered}")

        assert np.array_equal(forward(), want)
        assert asleep() == [compiled_team.ASLEEP] * 3, where()
        start = list(entered)
        for _ in range(20):
            time.sleep(0.002)  # past any spin: asleep
            assert np.array_equal(forward(), want)
        assert asleep() == [compiled_team.ASLEEP] * 3, where()
        assert entered == start, (entered, start)  # woken in the loop, never through the queue
        assert team.run(lambda i: i * i, [1, 2], threads=2) == [1, 4]
        assert asleep() == [compiled_team.ASLEEP] * 3, where()
        assert entered[1:] == start[1:], (entered, start)  # the others never left the loop
        assert np.array_equal(forward(), want)
    finally:
        team.resize(before)


@NUMBA
def test_a_helper_that_outlives_a_resize_never_writes_into_the_new_teams_pool(monkeypatch):
    """A helper still busy when resize stops waiting for it (team.JOIN_S: a machine too loaded to
    run it) keeps to the old pool: the new team gets a pool of its own, the old helper never enters
    it, and every new helper sleeps there (round 11 saw [0, 2, 2]: an old helper's "on my queue"
    written over the new helper 0's line, which then was never woken through its futex)."""
    import threading
    import time

    from smallem.backends.cpu import compiled_team

    if not compiled_team.SLEEPS:
        pytest.skip("no futex on this system: helpers past their spin return to their queues")
    compiled_linears(monkeypatch, pool="1")
    before = team.size()
    x, w, b, r, _ = data((5, 300), 24, 40, seed=11)
    forward = lambda: linear.linear_add_forward(CPU, x, w, b, r, LinearAdd())  # noqa: E731
    busy, gate = threading.Event(), threading.Event()

    class Stuck:  # a job that holds its helper until the gate opens
        @staticmethod
        def work() -> None:
            busy.set()
            gate.wait(30)

    try:
        team.resize(3)
        want = forward()
        old_pool, old = linear._pool(), team._threads[0]
        old_pool.recall(1)  # helper 0 out of the loop, to its queue, as team.run does
        team._inboxes[0].put((Stuck, old_pool.recalled(0)))
        assert busy.wait(10)
        monkeypatch.setattr(team, "JOIN_S", 0.05)
        team.resize(4)  # helper 0 of the old team still busy: it outlives the wait
        assert old.is_alive() and team._pool is None
        assert np.array_equal(forward(), want)
        pool = team._pool
        assert pool is not None and pool is not old_pool
        gate.set()
        old.join(10)
        assert not old.is_alive()
        deadline = time.time() + 30
        while not all(pool.asleep(i) for i in range(3)) and time.time() < deadline:
            time.sleep(0.01)
        assert [pool.where(i) for i in range(3)] == [compiled_team.ASLEEP] * 3
        assert np.array_equal(forward(), want)
    finally:
        gate.set()
        team.resize(before)


def test_a_bad_spin_or_pool_is_one_sentence(monkeypatch):
    from smallem.errors import SmallemError

    monkeypatch.setenv("SMALLEM_TEST_NUMBER", " 3.5 ")  # the one parser both grains read through
    assert team.positive_env("SMALLEM_TEST_NUMBER", 8.0, "a number") == 3.5
    for bad in ("0", "-1", "1e7", "fine", "nan", "inf"):
        monkeypatch.setenv("SMALLEM_TEST_NUMBER", bad)
        with pytest.raises(SmallemError, match=r"SMALLEM_TEST_NUMBER=.*: give a number, more than 0 "
                                               r"\(or unset it for the default, 8\)"):
            team.positive_env("SMALLEM_TEST_NUMBER", 8.0, "a number")
    monkeypatch.setenv(team.GRAIN_ENV, "")
    assert team._grain() == 8.0
    monkeypatch.setenv(team.GRAIN_ENV, "2")
    assert team._grain() == 2.0
    for bad in ("0", "fine", "nan"):  # read at import, where a bare float() was a traceback
        monkeypatch.setenv(team.GRAIN_ENV, bad)
        with pytest.raises(SmallemError, match="SMALLEM_GRAIN=.*: give the units of work"):
            team._grain()
    monkeypatch.setenv(team.SPIN_ENV, "")
    assert team.spin_us() == team.SPIN_US
    monkeypatch.setenv(team.SPIN_ENV, "200")
    assert team.spin_us() == 200.0
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv(team.SPIN_ENV, bad)
        with pytest.raises(SmallemError, match="SMALLEM_SPIN=.*: give the µs a helper waits"):
            team.spin_us()
    monkeypatch.setenv(linear.POOL_ENV, "yes")
    with pytest.raises(SmallemError, match="SMALLEM_POOL='yes': give 1 .* or 0"):
        linear._pool()
    monkeypatch.setenv(linear.POOL_GRAIN_ENV, "")
    assert linear.pool_grain() == linear.POOL_GRAIN
    monkeypatch.setenv(linear.POOL_GRAIN_ENV, "2")
    assert linear.pool_grain() == 2.0
    for bad in ("0", "-1", "fine", "nan"):
        monkeypatch.setenv(linear.POOL_GRAIN_ENV, bad)
        with pytest.raises(SmallemError, match="SMALLEM_POOL_GRAIN=.*: give the units of work"):
            linear.pool_grain()


@NUMBA
def test_a_pool_job_wakes_a_thread_per_pool_grain_and_gives_the_same_bits(monkeypatch):
    """The pool's pieces take no GIL, so its jobs wake one thread per POOL_GRAIN units of work
    (team.worth's), not one per team.GRAIN; the bits do not move with it."""
    compiled_linears(monkeypatch, pool="1")
    before = team.size()
    x, w, b, r, g = data((5, 300), 24, 40, seed=11)
    woken = []
    pooled = team.pooled
    monkeypatch.setattr(team, "pooled", lambda *a: (woken.append(a[3]), pooled(*a))[1])
    try:
        team.resize(8)
        got = {}
        for grain in ("1", "8"):
            monkeypatch.setenv(linear.POOL_GRAIN_ENV, grain)
            woken.clear()
            got[grain] = (linear.linear_add_forward(CPU, x, w, b, r, LinearAdd()),
                          *linear.linear_rule(CPU, g, None, x, w, b, Linear()))
            units = 1500 * 24 * 40 / products.MIN_MACS
            assert woken[:2] == [team.worth(units, float(grain)), team.worth(2 * units, float(grain))]
        assert woken[0] < team.worth(units, 1.0)
        assert all(np.array_equal(p, q) for p, q in zip(got["1"], got["8"]))
    finally:
        team.resize(before)


def test_the_pool_runs_where_asked_or_from_pool_from_threads(monkeypatch):
    """Unset, the pool runs from POOL_FROM threads (measured faster at 16 on the host, slower on
    2 pinned cores); SMALLEM_POOL=1 asks for it from 2, 0 never; one thread never."""
    before = team.size()
    try:
        for size, asked, wanted in ((3, "", False), (3, "1", True), (3, "0", False), (1, "1", False),
                                    (linear.POOL_FROM, "", True), (linear.POOL_FROM, "0", False)):
            team.resize(size)
            monkeypatch.setenv(linear.POOL_ENV, asked)
            assert (linear._pool() is not None) is wanted, (size, asked)
    finally:
        team.resize(before)


@NUMBA
@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_forked_child_starts_its_team_again_and_runs_a_linear(monkeypatch):
    """A child forked from a process whose helpers spin in the pool has none of those threads: its
    team is one thread again, and a Linear there gives the parent's bits."""
    import os

    compiled_linears(monkeypatch, pool="1")
    before = team.size()
    x, w, b, r, _ = data((5, 300), 24, 40, seed=7)
    try:
        team.resize(3)
        want = linear.linear_add_forward(CPU, x, w, b, r, LinearAdd())
        assert team._pool is not None
        child = os.fork()
        if child == 0:  # the child: exit status 0 only if all holds
            ok = team.size() == 1 and team._pool is None
            got = linear.linear_add_forward(CPU, x, w, b, r, LinearAdd())
            os._exit(0 if ok and np.array_equal(got, want) else 1)
        _, status = os.waitpid(child, 0)
        assert os.WEXITSTATUS(status) == 0
    finally:
        team.resize(before)


@NUMBA
def test_adamws_pieces_as_a_pool_job_are_the_numpy_passes_bits(monkeypatch):
    """SMALLEM_POOL_JOBS=1: AdamW's compiled pieces taken by the pool's helpers inside their loop
    (compiled_jobs.py) give the NumPy passes' bits on 3 and 16 threads, step after step with the
    team's NumPy runs between."""
    from smallem.backends.cpu import compiled_team

    monkeypatch.setenv(compiled.ENV, "numba")
    monkeypatch.setenv(linear.POOL_ENV, "1")
    monkeypatch.setenv(linear.POOL_JOBS_ENV, "1")
    monkeypatch.setattr(products, "MIN_ITEMS", 1 << 8)  # many pieces
    rng = np.random.default_rng(13)
    shapes = [(257, 64), (64,), (64, 256), (1,), (5, 7)]
    state = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(4)]
    state[3] = [np.abs(v) for v in state[3]]
    settings = dict(steps=[3, 3, 3, 1, 2], lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
                    weight_decays=[0.1, 0.0, 0.1, 0.0, 0.1])
    reference = [[v.copy() for v in group] for group in state]
    mine = [[v.copy() for v in group] for group in state]
    kinds, before = [], team.size()
    try:
        for turn, n in enumerate((3, 16, 3, 16)):
            team.resize(n)
            pool = linear._pool()
            if not hasattr(pool.publish_job, "spied"):
                publish = pool.publish_job
                spied = lambda h, v, kind, c, publish=publish: kinds.append(kind) or publish(h, v, kind, c)  # noqa: E731
                spied.spied = True
                monkeypatch.setattr(pool, "publish_job", spied)
            ArrayBackend.adamw_update(CPU, *reference, **settings)
            CPU.adamw_update(*mine, **settings)
            assert team.run(lambda i: -i, [1, 2, 3]) == [-1, -2, -3]
            assert all(np.array_equal(p, q) for got, want in zip(mine, reference)
                       for p, q in zip(got, want)), turn
    finally:
        team.resize(before)
    assert kinds == [compiled_team.ADAMW] * 4


def test_a_shapes_plan_is_made_once_and_follows_the_cut_settings(monkeypatch):
    """linear.Plan is made once a shape (round 15), its key holding the cut's settings: a test that
    changes them (the fixture above), or r14_cpu_linear.py's team.MAX_PIECES, gets its own cut."""
    x, w, b, _, _ = data()  # 427 rows of 24 -> 40
    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)
    plan = linear._cut(x, w, b)
    assert len(plan.cut) == 16 and linear._cut(x, w, b) is plan
    monkeypatch.setattr(products, "MIN_MACS", 1 << 17)
    assert len(linear._cut(x, w, b).cut) == 3
    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)
    monkeypatch.setattr(team, "MAX_PIECES", 2)
    assert len(linear._cut(x, w, b).cut) == 2
