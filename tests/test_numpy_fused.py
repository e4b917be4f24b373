"""The float32 CPU's fused table (backends/numpy_fused.py) against the reference rules it stands
in for: the same values and gradients up to float32 rounding, on one block or many, and
declining what it cannot take."""

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem.autodiff.operations import OPERATIONS, CrossEntropy, LayerNorm, Softmax
from smallem.autodiff.primitives import RULES
from smallem.autodiff.tape import Tape
from smallem.backends import get_backend
from smallem.backends import numpy_fused as F
from smallem.models.transformer import Transformer, TransformerConfig

CPU = get_backend("cpu")


NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")


@pytest.fixture(params=[(1 << 9, 1, "numpy"), (1 << 9, 3, "numpy"), (1 << 20, 1, "numpy"),
                        pytest.param((1 << 9, 3, "numba"), marks=NUMBA),
                        pytest.param((1 << 20, 1, "numba"), marks=NUMBA)],
                ids=["many blocks", "many blocks on three threads", "one block",
                     "compiled, many blocks on three threads", "compiled, one block"])
def blocks(request, monkeypatch):
    from smallem.backends.cpu import compiled, team

    block, threads, route = request.param
    monkeypatch.setenv(compiled.ENV, route)  # the NumPy kernels, or numba's (cpu/compiled.py)
    monkeypatch.setattr(F, "BLOCK", block)  # small blocks: every input splits
    before = team.size()
    team.resize(threads)  # the blocks shared over a team (backends/cpu/team.py)
    yield block
    team.resize(before)


def both(build, *arrays, seed_grad=True):
    """Value and input gradients of build(tape, *leaves) with the fused table and without."""
    out = []
    for fused in (True, False):
        tape = Tape(CPU, fused=fused)
        leaves = [tape.leaf(a) for a in arrays]
        y = build(tape, *leaves)
        rng = np.random.default_rng(7)  # random output weights: a mixed-up element shows
        weights = rng.normal(size=y.shape).astype(np.float32) if seed_grad else None
        grads = tape.backward(y, weights) if seed_grad else tape.backward(y)
        out.append((np.array(y.value), [np.array(grads[v]) for v in leaves]))
    return out


def close(results, rtol=2e-5):
    (y1, g1), (y2, g2) = results
    scale = lambda a: max(float(np.abs(a).max()), 1e-30)  # noqa: E731
    assert np.abs(y1 - y2).max() <= rtol * scale(y2)
    for a, b in zip(g1, g2):
        assert a.shape == b.shape and a.dtype == np.float32
        assert np.abs(a - b).max() <= rtol * scale(b), np.abs(a - b).max() / scale(b)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("spread", [3.0, 300.0], ids=["one shift", "row maxima"])
def test_softmax_matches_its_reference(blocks, causal, spread):
    x = spread * np.random.default_rng(1).normal(size=(3, 2, 17, 17)).astype(np.float32)
    close(both(lambda t, a: t.apply(Softmax(causal), [a]), x))


def test_softmax_of_entries_far_apart_keeps_every_row_finite(blocks):
    x = np.zeros((4, 5), np.float32)
    x[0, 0], x[1] = 80.0, -1e4  # the block spans more than SPREAD: rows are shifted one by one
    y = F.softmax_forward(CPU, x, Softmax())
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    assert np.isfinite(y).all() and y[0, 0] == 1.0


@pytest.mark.parametrize("shape", [(7, 33), (2, 5, 12)])
def test_layer_norm_matches_its_reference(blocks, shape):
    rng = np.random.default_rng(2)
    x = (3 + rng.normal(size=shape)).astype(np.float32)
    w, b = rng.normal(size=shape[-1:]).astype(np.float32), rng.normal(size=shape[-1:]).astype(np.float32)
    close(both(lambda t, a, c, d: t.apply(LayerNorm(), [a, c, d]), x, w, b))


def test_gelu_and_the_scale_match_their_references(blocks):
    rng = np.random.default_rng(3)
    x = (2 * rng.normal(size=(9, 70))).astype(np.float32)
    s = np.float32(0.25) + np.zeros((), np.float32)
    close(both(lambda t, a, c: t.gelu(a) * c, x, s))
    close(both(lambda t, a, c: t.add(a, c), x, rng.normal(size=70).astype(np.float32)))


def test_gelus_forward_matches_float64(blocks):
    """The backend's gelu (no rule to compare it through: both tapes call it) against the float64
    reference, tails included (|a| up to 12: e^−2u near its clip)."""
    x = np.concatenate([np.linspace(-12, 12, 601), 2 * np.random.default_rng(8).normal(size=999)])
    mine = CPU.gelu(x.astype(np.float32).reshape(16, 100))
    want = get_backend("cpu64").gelu(x.reshape(16, 100))
    assert mine.dtype == np.float32 and np.abs(mine - want).max() <= 2e-6 * np.abs(want).max()


def test_cross_entropy_matches_its_reference(blocks):
    rng = np.random.default_rng(4)
    logits, targets = (4 * rng.normal(size=(5, 9, 31))).astype(np.float32), rng.integers(0, 31, (5, 9))
    close(both(lambda t, a: t.apply(CrossEntropy(targets), [a]), logits, seed_grad=False))


def test_a_transformer_step_gets_the_reference_gradients(blocks):
    config = TransformerConfig(layers=1, width=16, heads=2, context=8, vocab=19)
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 19, (3, 8)), rng.integers(0, 19, (3, 8))
    model = Transformer(config, CPU, seed=1)
    results = []
    for fused in (True, False):
        tape = Tape(CPU, fused=fused)
        loss = model.loss(tape, x, y)
        grads = tape.backward(loss)
        results.append((np.array(loss.value), [np.array(p.grad(grads)) for p in model.parameters()]))
    (l1, g1), (l2, g2) = results
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    for name, a, b in zip(model.parameter_names(), g1, g2):
        # key.bias's gradient is 0 in exact arithmetic (softmax ignores a shift shared by a row):
        # both sides are rounding noise there, so it is compared against the others' size
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * max(abs(g).max() for g in g2),
                                   err_msg=name)


def test_what_it_cannot_take_it_declines():
    x64 = np.ones((4, 8))
    strided = np.ones((8, 4), np.float32).T
    assert F.softmax_forward(CPU, x64, Softmax()) is None
    assert F.softmax_forward(CPU, strided, Softmax()) is None
    assert F.layer_norm_forward(CPU, strided, np.ones(8, np.float32), np.ones(8, np.float32),
                                LayerNorm()) is None
    assert F.gelu(x64) is None
    assert F.mul_rule(CPU, np.ones((2, 3), np.float32), None, np.ones((2, 3), np.float32),
                      np.ones(3, np.float32)) is None  # a row, not one number
    assert get_backend("cpu64").fused == {} and get_backend("cpu64").fused_forward == {}


def test_row_max_is_the_maximum_of_every_row():
    rng = np.random.default_rng(8)
    for width in (1, 2, 3, 31, 64, 100, 129):
        a = rng.normal(size=(6, width)).astype(np.float32)
        a[2, -1] = np.nan
        np.testing.assert_array_equal(F.row_max(a), a.max(axis=-1, keepdims=True))


def test_blocks_cover_every_row_once_and_hold_whole_matrices():
    spans = lambda *args, **kw: F.each(lambda s: (s.start, s.stop), *args, **kw)  # noqa: E731
    assert spans(82, F.BLOCK // 4) == [(i, min(82, i + 4)) for i in range(0, 82, 4)]  # BLOCK floats
    assert spans(160, F.BLOCK // 8, multiple=4) == [(i, i + 8) for i in range(0, 160, 8)]  # 2 matrices
    assert spans(12, F.BLOCK, multiple=4) == [(0, 4), (4, 8), (8, 12)]  # never less than one
    # fewer than 16 BLOCKs: 16 blocks where each keeps LEAST floats or more (16 threads find work)
    assert spans(10, F.BLOCK // 4) == [(i, i + 1) for i in range(10)]
    assert spans(4096, 64) == [(i, i + 256) for i in range(0, 4096, 256)]  # the step's LayerNorm
    assert spans(300, 64) == [(0, 256), (256, 300)] and spans(100, 3) == [(0, 100)]


@pytest.mark.parametrize("name", list(F.FUSED))
def test_each_rule_follows_its_references_contract(name):
    """(be, grad, out, *inputs, *args), as RULES[name] or the operation's backward takes them."""
    fn = F.FUSED[name]
    params = list(inspect.signature(fn).parameters)
    assert params[:3] == ["be", "grad", "out"] and name in RULES
    reference = OPERATIONS[name].backward if name in OPERATIONS else RULES[name]
    assert len(params) == len(inspect.signature(reference).parameters)


@pytest.mark.parametrize("name", list(F.FUSED_FORWARD))
def test_each_forward_takes_its_operations_inputs(name):
    fn = F.FUSED_FORWARD[name]
    assert list(inspect.signature(fn).parameters)[0] == "be"
    assert len(inspect.signature(fn).parameters) == len(
        inspect.signature(OPERATIONS[name].forward).parameters)  # (be, *inputs, op) for (self, be, ...)


def test_an_output_just_ahead_of_its_input_modulo_4k_runs_backward():
    """numpy_fused.backward: out 1 to NEAR bytes ahead of an input (mod 4 KiB) and behind none
    runs from the end (4K aliasing); the compiled GELU passes give the same bits either way."""
    raw = np.empty(3 * F.PAGE, np.uint8)
    at = lambda offset: raw[offset:offset + F.PAGE].view(np.float32)  # noqa: E731
    a = at(64)
    assert F.backward(at(64 + 16), a) and F.backward(at(64 + F.NEAR), a)
    assert not F.backward(at(64), a) and not F.backward(at(64 + 2048), a)
    assert not F.backward(at(64 + 16), a, at(64 + 32))  # 16 ahead of one input, 16 behind another
    if importlib.util.find_spec("numba") is None:
        return
    from smallem.backends.cpu import compiled_kernels as kernels

    x = (3 * np.random.default_rng(9).normal(size=1001)).astype(np.float32)
    outs = [np.empty_like(x) for _ in range(4)]
    kernels.gelu(x, outs[0], False)
    kernels.gelu(x, outs[1], True)
    kernels.gelu_rule(x, x[::-1].copy(), outs[2], False)
    kernels.gelu_rule(x, x[::-1].copy(), outs[3], True)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[2], outs[3])


@NUMBA
def test_the_pools_gelu_layer_norm_and_cross_entropy_jobs_are_team_runs_bits(monkeypatch):
    """SMALLEM_POOL_JOBS=1: GELU's, LayerNorm's and the cross-entropy's compiled blocks (forward
    and rule) taken by the pool's helpers inside their loop (cpu/compiled_jobs.py)
    give team.run's bits, on 1, 3 and 16 threads, run after run with the team's NumPy runs and
    resizes between, in a process that made the pool first."""
    from smallem.backends.cpu import compiled, compiled_team, linear, team

    monkeypatch.setenv(compiled.ENV, "numba")
    monkeypatch.setenv(linear.POOL_ENV, "1")
    monkeypatch.setattr(F, "BLOCK", 1 << 9)  # many blocks
    rng = np.random.default_rng(12)
    x = (2 * rng.normal(size=(37, 70))).astype(np.float32)
    w, b = rng.normal(size=70).astype(np.float32), rng.normal(size=70).astype(np.float32)
    targets = rng.integers(0, 70, 37)

    def step():
        tape = Tape(CPU)
        leaves = [tape.leaf(a) for a in (x, w, b)]
        y = tape.gelu(tape.apply(LayerNorm(), leaves))
        loss = tape.apply(CrossEntropy(targets), [y])
        grads = tape.backward(loss)
        return [np.array(y.value), np.array(loss.value)] + [np.array(grads[v]) for v in leaves]

    kinds, before = [], team.size()
    try:
        team.resize(3)
        monkeypatch.setenv(linear.POOL_JOBS_ENV, "0")
        assert linear._pool() is not None  # made before any kernel runs, as in a training step
        want = step()
        monkeypatch.setenv(linear.POOL_JOBS_ENV, "1")
        pool = linear._pool()
        publish = pool.publish_job
        monkeypatch.setattr(pool, "publish_job",
                            lambda h, v, kind, c: kinds.append(kind) or publish(h, v, kind, c))
        for turn, n in enumerate((3, 16, 3, 1, 3, 16) * 3):
            team.resize(n)
            if turn % 2:
                assert team.run(lambda i: i + 1, list(range(6))) == list(range(1, 7))
            got = step()
            assert all(np.array_equal(p, q) for p, q in zip(got, want)), (turn, n)
    finally:
        team.resize(before)
    per_step = [compiled_team.LAYER_NORM, compiled_team.GELU, compiled_team.CROSS_ENTROPY,
                compiled_team.CROSS_ENTROPY_RULE, compiled_team.GELU_RULE, compiled_team.LAYER_NORM_RULE]
    assert kinds == per_step * 15  # every step but the three on one thread (no pool there)


@NUMBA
def test_the_pools_jobs_are_team_runs_bits_with_numbas_cache_warm(monkeypatch):
    """The test above in a fresh interpreter, every kernel and the pool's loop loaded from numba's
    cache (the run here first writes what it lacks), the pool's loop loaded before the kernels:
    round 13 found the pool's LayerNorm and GELU an ulp off team.run's there (580 of 2,590
    elements), the cached loop's linked copy of each kernel running instead of the kernel's own
    code (compiled_jobs._own_code). Not in this process: other tests may have loaded the kernels
    first, and the copies are not run then."""
    test_the_pools_gelu_layer_norm_and_cross_entropy_jobs_are_team_runs_bits(monkeypatch)
    code = ("import sys, pytest; sys.path.insert(0, sys.argv[1]); import test_numpy_fused as t\n"
            "with pytest.MonkeyPatch.context() as patch:\n"
            "    t.test_the_pools_gelu_layer_norm_and_cross_entropy_jobs_are_team_runs_bits(patch)")
    run = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
