"""The float32 CPU's engine (backends/cpu/): malloc keeps its pages, one decision of the thread
count, and every product, pass, sum and update shared over the team against plain NumPy (float64
for the products, to float32 tolerances derived from eps), in the same bits on one thread or many."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.backends.cpu import memory, products, team, threads
from smallem.errors import SmallemError
from smallem.models.transformer import Transformer, TransformerConfig

CPU = get_backend("cpu")
EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(params=[1, 3], ids=["one thread", "three threads"])
def threads_(request):
    before = team.size()
    team.resize(request.param)
    yield request.param
    team.resize(before)


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(products, "MIN_MACS", 1 << 12)  # small shapes cut into many pieces
    monkeypatch.setattr(products, "MIN_ITEMS", 1 << 8)


def on_teams(fn):
    """fn() on a team of one thread and of three: both results (the team restored after)."""
    before, out = team.size(), []
    for n in (1, 3):
        team.resize(n)
        out.append(fn())
    team.resize(before)
    return out


def test_kept_pages_are_not_faulted_in_again():
    """A 40 MB array made and freed again and again: above glibc's sliding mmap threshold, each
    one is fresh pages the kernel zeroes on first touch, unless keep_pages() kept the heap."""
    code = ("import sys, numpy as np\nfrom smallem.backends.cpu import memory\n"
            "kept = memory.keep_pages() if sys.argv[1] == 'kept' else None\n"
            "for k in range(6):\n    if k == 2: before = memory.minor_faults()\n"
            "    a = np.ones(10_000_000, np.float32); del a\n"
            "print(kept, memory.minor_faults() - before)")
    runs = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                                check=True).stdout.split() for how in ("plain", "kept")}
    if not sys.platform.startswith("linux"):
        assert runs["kept"][0] == "False"
        return
    assert runs["kept"][0] == "True"
    assert int(runs["plain"][1]) > 10 * (int(runs["kept"][1]) + 1), runs


def test_smallem_threads_decides_and_a_bad_value_is_one_sentence(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.decide()[0] == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(threads.ENV, bad)
        with pytest.raises(SmallemError, match="SMALLEM_THREADS=.*whole number of threads"):
            threads.decide()


def test_more_threads_than_four_a_cpu_is_one_sentence_before_any_starts(monkeypatch, capsys):
    """Asked for 100,000, the team started 22,318 on the 2-core machine before the system refused
    the next (round 17): now past four a usable CPU (at least 64) is refused before any starts."""
    from smallem.tools.cli import main

    monkeypatch.setattr(threads, "usable_cpus", lambda: [0, 1])
    assert threads.most_asked() == 64
    monkeypatch.setenv(threads.ENV, "64")
    assert threads.decide()[0] == 64
    monkeypatch.setenv(threads.ENV, "65")
    with pytest.raises(SmallemError, match=r"^SMALLEM_THREADS=65: this process may use 2 CPUs; give at "
                                           r"most 64 threads \(more only wait for one another\), or unset"):
        threads.decide()
    monkeypatch.setattr(threads, "usable_cpus", lambda: list(range(32)))
    assert threads.most_asked() == 128 and threads.decide()[0] == 65
    monkeypatch.delenv(threads.ENV)
    monkeypatch.setattr(team, "resize", lambda n: pytest.fail(f"{n} threads started"))
    assert main(["train", "--threads", "100000", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "smallem train: error: --threads 100000: this process may use 32 CPUs; give at most 128 threads "
        "(more only wait for one another), or leave it out to let smallem choose")


def test_a_busy_machine_gets_one_thread_and_an_idle_one_every_core(monkeypatch):
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: list(range(16)))
    monkeypatch.setattr(threads, "physical_cores", lambda cpus: 8)  # two hyperthreads a core
    for load, expected in ((0, 8), (9, 7), (15, 1), (40, 1)):
        monkeypatch.setattr(threads, "busy_cores", lambda load=load: load)
        assert threads.decide()[0] == expected


@pytest.mark.parametrize("linear, cap", [("numpy", 8), pytest.param("numba", 16, marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba not installed"))])
def test_the_default_stops_where_measured_and_asking_goes_past(monkeypatch, linear, cap):
    """Past 8 threads the step got slower on a 16-core host with NumPy's calls for the Linears
    (round8/cpu.md), faster with them compiled (round9/cpu2.md): the default stops at 8 or 16;
    SMALLEM_THREADS (or --threads) still asks for every core."""
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setenv("SMALLEM_KERNELS", "numba" if linear == "numba" else "numpy")
    monkeypatch.setenv("SMALLEM_LINEAR", linear)
    monkeypatch.setattr(threads, "usable_cpus", lambda: list(range(32)))
    monkeypatch.setattr(threads, "physical_cores", lambda cpus: 32)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0)
    assert threads.decide()[0] == cap
    monkeypatch.setenv(threads.ENV, "32")
    assert threads.decide()[0] == 32


def test_settle_gives_the_team_its_threads_and_blas_one(monkeypatch):
    from threadpoolctl import threadpool_info

    before = team.size()
    monkeypatch.setenv(threads.ENV, "3")
    assert threads.settle() == 3 and team.size() == 3
    assert {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"} == {1}
    team.resize(before)


def test_pieces_cover_everything_once_and_depend_on_the_shape_alone():
    for total, weight, least, multiple in ((1000, 7, 500, 1), (4096, 16384, 1 << 20, 8),
                                          (13, 1, 1, 4), (5, 1, 100, 1)):
        cut = team.pieces(total, weight, least, multiple)
        assert cut[0].start == 0 and cut[-1].stop == total and len(cut) <= team.MAX_PIECES
        assert all(a.stop == b.start and a.stop % multiple == 0 for a, b in zip(cut, cut[1:]))
    cut = team.pieces(1000, 7, 500)
    spans = [(s.start, s.stop) for s in cut]
    assert on_teams(lambda: team.run_pieces(lambda s: (s.start, s.stop), cut)) == [spans, spans]


def test_a_helper_held_up_elsewhere_holds_up_no_one():
    """The caller waits for the pieces, not for every helper it woke: with the only helper stuck
    in another caller's piece (until a timer frees it), a run's pieces are all done by its own
    caller, who returns before the helper is free."""
    import threading

    before, free = team.size(), threading.Event()
    team.resize(2)
    timer = threading.Timer(3.0, free.set)  # frees the helper whatever happens: no test hangs
    try:
        started = threading.Barrier(3)
        other = threading.Thread(target=team.run, args=(lambda p: (started.wait(), free.wait()), [0, 1]))
        other.start()
        started.wait()  # the other caller and the helper each hold one of its pieces
        timer.start()
        squares = team.run(lambda p: p * p, [1, 2, 3, 4])
        returned_while_stuck = not free.is_set()
    finally:
        free.set()
        timer.cancel()
        other.join()
        team.resize(before)
    assert squares == [1, 4, 9, 16] and returned_while_stuck


def test_an_error_in_a_piece_is_raised_by_the_caller_and_the_team_goes_on(threads_):
    def piece(p):
        if p == 5:
            raise ValueError("piece 5")
        return p

    with pytest.raises(ValueError, match="piece 5"):
        team.run(piece, list(range(8)))
    assert team.run(lambda p: -p, list(range(8))) == [-p for p in range(8)]


def _products_close(c, a, b):
    """|c − a·b| within 2·K·eps·(|a|·|b|), float32's bound for a sum of K products."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 2 * a.shape[-1] * EPS * (np.abs(a64) @ np.abs(b64))
    assert c.dtype == np.float32 and c.shape == (a64 @ b64).shape
    assert (np.abs(c - a64 @ b64) <= bound).all()


@pytest.mark.parametrize("shape_a, shape_b", [((1003, 67), (67, 129)),  # rows, uneven pieces
                                              ((37, 2049), (2049, 61)),  # the inner dimension
                                              ((7, 3, 61, 33), (7, 3, 33, 59))])  # stacked
def test_products_match_float64_in_the_same_bits_on_any_team(small_pieces, shape_a, shape_b):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=shape_a).astype(np.float32), rng.normal(size=shape_b).astype(np.float32)
    one, three = on_teams(lambda: products.matmul(a, b))
    assert one is not None and np.array_equal(one, three)
    _products_close(one, a, b)
    transposed = np.ascontiguousarray(b.swapaxes(-1, -2)).swapaxes(-1, -2)  # a strided view
    _products_close(on_teams(lambda: products.matmul(a, transposed))[1], a, b)


def test_passes_and_sums_match_plain_numpy_on_any_team(small_pieces):
    """(AdamW over the team: tests/test_cpu_linear.py, on the NumPy route and numba's.)"""
    rng = np.random.default_rng(1)
    x, bias = rng.normal(size=(301, 7, 13)).astype(np.float32), rng.normal(size=13).astype(np.float32)
    for ufunc in (np.add, np.subtract, np.multiply):
        for other in (bias, 0.5, x[::-1].copy(), x.swapaxes(0, 1).copy().swapaxes(0, 1)):
            one, three = on_teams(lambda: products.elementwise(ufunc, x, other))
            assert one is None and np.array_equal(three, ufunc(x, other))  # one thread: NumPy's own
    assert on_teams(lambda: products.elementwise(np.multiply, x, np.float64(0.5))) == [None, None]
    one, three = on_teams(lambda: products.sum_first(x))
    assert np.array_equal(one, three)
    bound = 301 * EPS * np.abs(x).sum(0)  # K·eps·Σ|x|: float32's bound for a sum of K terms
    assert (np.abs(one - x.astype(np.float64).sum(0)) <= bound).all()
    team.resize(1)


def test_a_transformer_step_is_the_same_bits_on_one_thread_or_many(small_pieces, monkeypatch):
    """The whole float32 step (fused table, products, sums) on teams of 1 and 3: the loss and
    every gradient bit for bit, so a run's numbers do not depend on the machine's load."""
    from smallem.backends import numpy_fused

    monkeypatch.setattr(numpy_fused, "BLOCK", 1 << 10)  # the fused table in many blocks too
    config = TransformerConfig(layers=1, width=32, heads=2, context=32, vocab=19)
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 19, (16, 32)), rng.integers(0, 19, (16, 32))
    model = Transformer(config, CPU, seed=1)

    def step():
        tape = Tape(CPU)
        loss = model.loss(tape, x, y)
        grads = tape.backward(loss)
        return np.array(loss.value), [np.array(p.grad(grads)) for p in model.parameters()]

    (l1, g1), (l3, g3) = on_teams(step)
    assert l1 == l3 and all(np.array_equal(a, b) for a, b in zip(g1, g3))


def test_the_float64_backend_shares_nothing():
    be = get_backend("cpu64")
    assert not be.engine and be.fused == {}
    assert threads.ENV == "SMALLEM_THREADS" and memory.MMAP_AT >= 16 << 20


@pytest.mark.parametrize("command", [["train"], ["bench", "--model", "transformer"]])
def test_threads_option_is_smallem_threads_for_the_run(monkeypatch, command):
    from smallem.tools.options import use_threads
    from smallem.tools.parser import build_parser

    monkeypatch.delenv(threads.ENV, raising=False)
    args = build_parser().parse_args(command + ["--threads", "5"])
    use_threads(args)
    assert threads.decide() == (5, "SMALLEM_THREADS=5")


def test_threads_zero_is_one_sentence(capsys):
    from smallem.tools.cli import main

    assert main(["train", "--threads", "0", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("smallem train: error: --threads 0: give 1 or more "
                                               "(or leave it out to let smallem choose)")


def test_train_settles_the_threads_at_its_start(monkeypatch):
    from smallem.training.config import TrainConfig
    from smallem.training.loop import train

    before = team.size()
    team.resize(1)
    monkeypatch.setenv(threads.ENV, "2")
    train(TrainConfig(model="bigram", steps=1, backend="cpu", eval_every=1), progress=False, log=None)
    assert team.size() == 2
    team.resize(before)


def test_more_threads_than_the_system_allows_is_one_sentence_and_the_team_still_works(monkeypatch, capsys):
    """`--threads 100000` met the system's limit as a bare RuntimeError from threading; now one
    sentence, the helpers already started sent away, and the team usable at one thread."""
    from smallem.tools.cli import main

    real = team.threading.Thread

    class Limited(real):
        started = 0

        def start(self):
            if Limited.started == 3:
                raise RuntimeError("can't start new thread")
            Limited.started += 1
            super().start()

    before = team.size()
    team.resize(1)
    monkeypatch.setattr(team.threading, "Thread", Limited)
    assert main(["train", "--threads", "50", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("smallem train: error: 50 threads asked for, but the system let only 4 start "
                   "(can't start new thread): ask for fewer with --threads or SMALLEM_THREADS, "
                   "or leave both out to let smallem choose")
    assert team.size() == 1 and team.run(lambda x: x + 1, [1, 2, 3]) == [2, 3, 4]
    monkeypatch.setattr(team.threading, "Thread", real)
    team.resize(before)
