"""The float32 CPU's compiled route (backends/cpu/compiled.py): which kernels run, one sentence
for a bad choice, and numba's exp and tanh (plain arithmetic, no SVML) against NumPy's. The
kernels themselves are tested against the NumPy route's in test_numpy_fused.py and
test_cpu_attention.py."""

import builtins
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem.backends import cpu
from smallem.backends.cpu import compiled
from smallem.errors import SmallemError, SmallemWarning

NUMBA = pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")


def _forget_the_compiled_kernels(monkeypatch):
    """The next `kernels()` imports compiled_kernels afresh (out of sys.modules and off its
    package, where `from . import` would otherwise find it)."""
    monkeypatch.setattr(compiled, "_kernels", None)
    monkeypatch.delitem(sys.modules, "smallem.backends.cpu.compiled_kernels", raising=False)
    monkeypatch.delattr(cpu, "compiled_kernels", raising=False)


def test_a_route_that_does_not_exist_is_one_sentence(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "fortran")
    with pytest.raises(SmallemError, match="SMALLEM_KERNELS='fortran': give one of numba"):
        compiled.kernels()


def test_without_numba_the_default_is_numpy_and_asking_for_numba_is_one_sentence(monkeypatch):
    real_import = builtins.__import__

    def no_numba(name, *args, **kwargs):
        if name == "numba" or name.startswith("numba."):
            raise ImportError("no numba here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numba)
    _forget_the_compiled_kernels(monkeypatch)
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.kernels() is False and compiled.route() == "numpy"
    monkeypatch.setenv(compiled.ENV, "numba")
    with pytest.raises(SmallemError, match=r"numba is not installed: pip install 'smallem\[fast\]'"):
        compiled.kernels()


@NUMBA
def test_numba_is_the_default_where_installed_and_numpy_can_be_asked(monkeypatch):
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert compiled.route() == "numba" and compiled.attention()
    monkeypatch.setenv(compiled.ENV, "numba-table")
    assert compiled.kernels() and not compiled.attention()
    monkeypatch.setenv(compiled.ENV, "numpy")
    assert compiled.kernels() is False and compiled.route() == "numpy"


@NUMBA
def test_exp_and_gelus_tanh_in_plain_arithmetic_match_float64():
    import numba

    from smallem.backends.array import GELU_CUBIC, GELU_SCALE
    from smallem.backends.cpu.compiled_kernels import _exp, _tanh_u

    @numba.njit
    def both(x, e, t):
        for i in range(x.size):
            e[i], t[i] = _exp(x[i]), _tanh_u(x[i], x[i] * x[i])

    x = np.concatenate([np.linspace(-87, 88, 100_001), [-np.inf, -1e4, -88.0, 0.0, 1e-6, 20.0]]
                       ).astype(np.float32)
    e, t = np.empty_like(x), np.empty_like(x)
    both(x, e, t)
    want = np.exp(x.astype(np.float64))
    assert np.all(np.abs(e - want) <= 2e-7 * want + 1e-38)  # ~1 float32 ulp; 0 below e^−87.3
    assert e[-6] == 0.0 and e[-5] == 0.0
    x64 = x[np.isfinite(x)].astype(np.float64)
    tanh = np.tanh(GELU_SCALE * (x64 + GELU_CUBIC * x64 ** 3))
    assert np.abs(t[np.isfinite(x)] - tanh).max() <= 2e-7


@NUMBA
def test_a_nan_comes_out_as_it_does_from_numpy(monkeypatch):
    """A diverging run must still read NaN: exp(NaN) is NaN, not the 0 of exp below e^−87."""
    from smallem.autodiff import Tape, attention
    from smallem.autodiff.operations import CrossEntropy
    from smallem.backends import get_backend

    cpu = get_backend("cpu")
    logits = np.zeros((4, 7), np.float32)
    logits[1, 3] = np.nan
    heads = np.zeros((1, 1, 4, 2), np.float32)
    heads[0, 0, 2, 1] = np.nan
    for route in ("numpy", "numba"):
        monkeypatch.setenv(compiled.ENV, route)
        tape = Tape(cpu)
        loss = tape.apply(CrossEntropy(np.zeros(4, int)), [tape.leaf(logits)])
        assert np.isnan(float(loss.value)), route
        q = tape.leaf(heads)
        out = attention(tape, q, tape.leaf(heads.copy()), tape.leaf(heads.copy()), causal=True)
        assert np.isnan(np.asarray(out.value)[0, 0, 2:]).all(), route


@NUMBA
def test_where_numba_cannot_write_its_cache_the_numpy_route_runs_and_says_why(monkeypatch):
    """A read-only install with a read-only home (a container, a shared cluster): numba refuses
    to compile a cached function ("no locator available"). The default falls back to the NumPy
    route with one warning naming NUMBA_CACHE_DIR; asking for numba is one sentence."""
    from numba.core import caching

    def unwritable(self):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(caching._CacheLocator, "ensure_cache_path", unwritable)
    _forget_the_compiled_kernels(monkeypatch)
    monkeypatch.delenv(compiled.ENV, raising=False)
    with pytest.warns(SmallemWarning, match="NUMBA_CACHE_DIR"):
        assert compiled.kernels() is False and compiled.route() == "numpy"
    monkeypatch.setattr(compiled, "_kernels", None)
    monkeypatch.setenv(compiled.ENV, "numba")
    with pytest.raises(SmallemError, match="NUMBA_CACHE_DIR"):
        compiled.kernels()


@NUMBA
def test_the_row_max_by_bits_is_numpys_max():
    """_row_max compares floats as int32 bits (so that LLVM vectorizes it): every length from 1,
    −∞ (a causal mask), ±0, all-negative rows, and a NaN that must win, as NumPy's max."""
    import numba

    from smallem.backends.cpu.compiled_kernels import _row_max

    @numba.njit
    def each_length(x, out):
        for n in range(1, x.size + 1):
            out[n - 1] = _row_max(x, n)

    rng = np.random.default_rng(0)
    rows = [rng.normal(size=70) * 50, -np.abs(rng.normal(size=70)) - 1, np.full(70, -np.inf)]
    rows[0][::3] = -np.inf
    rows.append(np.where(np.arange(70) % 2, 0.0, -0.0))
    for row in (r.astype(np.float32) for r in rows):
        out = np.empty_like(row)
        each_length(row, out)
        want = np.maximum.accumulate(row)
        assert np.array_equal(out, want)  # ±0 equal (either is the max of −0 and +0)
    with_nan = rows[1].astype(np.float32)
    with_nan[5] = np.nan
    out = np.empty_like(with_nan)
    each_length(with_nan, out)
    assert not np.isnan(out[:5]).any() and np.isnan(out[5:]).all()


@NUMBA
def test_the_compiled_scatter_add_of_the_embedding_is_the_sorts_bits(monkeypatch):
    """numpy.py's scatter_add_rows (the embedding's rule) through compiled_passes' loop gives the
    sort-and-reduceat route's bits: each row's first term plus NumPy's pairwise sum of the rest
    (runs of 1 to ~1,000 terms: one by one, eight sums, halves), a row of −0.0s kept −0.0, rows
    never named left 0; out-of-range indices keep to NumPy's route (its wrap-around)."""
    from smallem.backends.numpy import NumpyBackend

    rng = np.random.default_rng(3)
    be = NumpyBackend("float32")
    for n, table, width in ((4096, 257, 64), (37, 5, 3), (300, 1000, 8), (3000, 4, 17)):
        values = (rng.normal(size=(n, width)) * 10.0 ** rng.integers(-3, 4, size=(n, 1))).astype(np.float32)
        values[::7] = -0.0
        rows = rng.integers(0, table - 1, size=n)
        rows[::7] = rows[0]  # a row whose first term is −0.0
        rows[1::97] = table - 1  # and a row of −0.0s alone
        values[1::97] = -0.0
        monkeypatch.setenv(compiled.ENV, "numpy")
        want = be.scatter_add_rows(values.reshape(n, 1, width), rows.reshape(n, 1), table)
        monkeypatch.setenv(compiled.ENV, "numba")
        got = be.scatter_add_rows(values.reshape(n, 1, width), rows.reshape(n, 1), table)
        assert got.shape == want.shape == (table, width) and np.signbit(want[-1]).all()
        assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert np.array_equal(be.scatter_add_rows(np.ones((2, 3), np.float32), np.array([-1, 0]), 4),
                          [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]])


CACHED_GELU = """
import numpy as np
from smallem.backends.cpu import compiled_kernels as k
x = np.linspace(-3, 3, 64, dtype=np.float32)
out = np.empty_like(x)
k.gelu(x, out, False)
print(repr(float(out.astype(np.float64).sum())), k.gelu.stats.cache_hits[k.gelu.signatures[0]])
"""


@NUMBA
def test_a_changed_helper_module_recompiles_the_cached_kernels_that_read_it(tmp_path):
    """numba keys its disk cache on the jitted function's own file: GELU's kernel froze
    backends/array.py's GELU_CUBIC into its machine code and kept it after array.py changed
    (round 12). compiled_cache keys the cache's folder on every compiled*.py and array.py: a
    changed constant there is a miss, the same files again a hit."""
    import shutil
    import subprocess

    import smallem

    tree = tmp_path / "tree"
    shutil.copytree(Path(smallem.__file__).parent, tree / "smallem",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("NUMBA_CACHE_DIR", None)  # numba's in-tree cache: the copy's own __pycache__

    def run() -> tuple[float, int]:
        out = subprocess.run([sys.executable, "-c", CACHED_GELU], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout.split()
        return float(out[0]), int(out[1])

    first, hits = run()
    assert hits == 0
    array = tree / "smallem" / "backends" / "array.py"
    array.write_text(array.read_text().replace("GELU_CUBIC = 0.044715", "GELU_CUBIC = 0.5"))
    changed, hits = run()
    assert hits == 0 and changed != first, "stale machine code: the old GELU_CUBIC"
    x = np.linspace(-3, 3, 64, dtype=np.float32).astype(np.float64)
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.5 * x**3)))
    assert changed == pytest.approx(expected.sum(), rel=1e-5)
    assert run() == (changed, 1)  # the same files: numba's cache, loaded



@NUMBA
def test_old_cache_folders_go_after_a_day_and_nothing_else_does(tmp_path):
    """compiled_cache.sweep: a smallem-<digest> folder nothing wrote to for a day goes; one
    written to within the day (a process may still run those sources), this process's own
    folder however old, and anything not named as digest() names folders stay."""
    from smallem.backends.cpu import compiled_cache as cc

    now = 1e9
    old, fresh, recent_file = "smallem-" + "a" * 16, "smallem-" + "b" * 16, "smallem-" + "c" * 16
    for name in (old, fresh, recent_file, cc.FOLDER, "smallem-notahash", "other"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "kernel.nbi").write_bytes(b"index")
        age = cc.STALE - 60 if name == fresh else cc.STALE + 60
        os.utime(folder / "kernel.nbi", (now - age, now - age))
        os.utime(folder, (now - age, now - age))
    os.utime(tmp_path / recent_file / "kernel.nbi", (now - 60, now - 60))  # a fresh write inside
    assert cc.sweep(tmp_path, now) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [fresh, recent_file, cc.FOLDER, "smallem-notahash", "other"])
    assert cc.sweep(tmp_path / "missing", now) == []
