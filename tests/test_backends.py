"""Backend arithmetic that the rules rely on, checked against exact formulas."""

import os
import subprocess
import sys

import numpy as np
import pytest

from smallem import Tape
from smallem.backends import DEFAULT_BACKEND, get_backend


def test_sigmoid_keeps_relative_precision_on_both_tails(backend):
    """0.5·(tanh(x/2) + 1) lost the small tail: relative error 2e-4 at −30, exactly 0 at −40
    (true 4.25e-18); float32 gave 0 from −20. Checked over the whole range, both dtypes."""
    x = np.linspace(-80, 80, 1601) if backend.dtype == np.float32 else np.linspace(-700, 700, 2801)
    x = x.astype(backend.dtype).astype(np.float64)  # the inputs the backend really sees
    exact = np.exp(-np.logaddexp(0.0, -x))  # 1/(1 + e⁻ˣ), through log-sum-exp
    got = np.asarray(backend.to_numpy(backend.sigmoid(backend.tensor(x))), np.float64)
    tiny = np.finfo(backend.dtype).tiny
    where = exact > tiny  # values float32 can still hold as normal numbers
    rel = np.abs(got[where] - exact[where]) / exact[where]
    assert rel.max() < (1e-6 if backend.dtype == np.float32 else 1e-14), rel.max()


def test_log_of_sigmoid_at_minus_40_is_minus_40_with_gradient_1():
    tape = Tape("cpu64")
    x = tape.leaf(-40.0)
    y = tape.log(tape.sigmoid(x))
    grads = tape.backward(y)
    assert float(y.value) == pytest.approx(-40.0, rel=1e-12)
    assert float(grads[x]) == pytest.approx(1.0, rel=1e-12)


def test_one_default_backend():
    assert DEFAULT_BACKEND == "cpu64" and get_backend(DEFAULT_BACKEND).dtype == np.float64


def test_building_cpu64_holds_blas_to_one_thread_as_the_float32_engine_does():
    """threads.one_blas_thread(): a float64 run takes BLAS's one thread too (OpenBLAS's spinning
    threads made notebook 13's float64 races 10-15x slower on a busy machine), whatever
    SMALLEM_THREADS asks of the float32 team. A fresh interpreter, BLAS first raised to two threads
    (so that this fails on a one-core machine too), then cpu64 built, then the float32 backend."""
    code = """
from threadpoolctl import threadpool_info, threadpool_limits
from smallem.backends import get_backend
threadpool_limits(2, user_api="blas")
pools = lambda: sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})
seen = [pools()]
get_backend("cpu64")
seen.append(pools())
get_backend("cpu")
print(seen + [pools()])
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SMALLEM_THREADS": "2"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[[2], [1], [1]]"
