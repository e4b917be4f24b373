"""What is lesson 17's own (the shared tests grade its exercises): the simulated devices' wire,
the reference ring against the plain sum and its byte count against the formula, the naive
gather's bytes, a course folder found by load_lessons and titled in progress(), the learner's
ring on two real MPI ranks, and one sentence where MPI is missing or a recording is unknown."""

from __future__ import annotations

import numpy as np
import pytest

from smallem import SmallemError
from smallem.course import EXERCISES, load_lessons, progress, recorded, solution
from smallem.course.l17_many_devices import mpi_ring
from smallem.course.l17_many_devices.mpi_ring import mpi_available, run_on_ranks
from smallem.course.l17_many_devices.ring import (
    Wire,
    chunk_bounds,
    naive_allreduce,
    ring_bytes,
    ring_reference,
)


@pytest.mark.parametrize("n, length", [(1, 4), (2, 9), (3, 10), (5, 3), (8, 1001)])
def test_the_reference_ring_sums_and_sends_what_the_formula_says(n, length):
    rng = np.random.default_rng(n)
    grads = [rng.normal(size=length) for _ in range(n)]
    wire = Wire(n)
    out = ring_reference([g.copy() for g in grads], wire.send)
    assert all(np.allclose(o, np.sum(grads, axis=0), rtol=0, atol=1e-12) for o in out)
    assert wire.sent == ring_bytes(length, n)
    assert all(dst == (src + 1) % n for src, dst, _ in wire.log)
    if length % n == 0:  # 2(N − 1)/N of the gradient, exactly, when N divides it
        assert wire.sent == [2 * (n - 1) * 8 * length // n] * n


def test_chunks_are_where_array_split_cuts():
    cuts = [len(c) for c in np.array_split(np.arange(10), 4)]
    assert [b - a for a, b in chunk_bounds(10, 4)] == cuts == [3, 3, 2, 2]


def test_the_gather_to_one_loads_device_zero():
    wire = Wire(4)
    out = naive_allreduce([np.full(6, float(r)) for r in range(4)], wire.send)
    assert all(np.array_equal(o, np.full(6, 6.0)) for o in out)
    assert wire.sent == [3 * 48, 48, 48, 48]


def test_a_message_to_nowhere_is_one_sentence():
    wire = Wire(3)
    with pytest.raises(SmallemError, match="device number from 0 to 2, got 3"):
        wire.send(0, 3, np.zeros(2))
    with pytest.raises(SmallemError, match="sends to itself"):
        wire.send(1, 1, np.zeros(2))


def test_the_lesson_folder_is_found_and_titled():
    assert "smallem.course.l17_many_devices.exercises" in load_lessons()
    assert {"17.ring_allreduce", "17.zero_state"} <= set(EXERCISES)
    assert "17  many devices" in str(progress())


def test_missing_mpi_says_how_to_install_it(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    hidden = lambda name, *a: None if name == "mpi4py" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    assert not mpi_available()
    with pytest.raises(SmallemError, match=r"pip install 'smallem\[ranks\]'"):
        run_on_ranks(solution("17.ring_allreduce"))


def test_an_unknown_recording_names_those_there_are():
    # the GPU record the lesson shows: one NCCL rank in the captured step, run on the H200
    assert recorded("ranks_gpu_one_rank")["tests/test_ranks_gpu.py"]["passed"] == 2
    with pytest.raises(SmallemError, match="no recorded result named 'ranks_gpu'"):
        recorded("ranks_gpu")


@pytest.mark.skipif(not mpi_available(), reason="mpi4py and mpiexec (smallem[ranks]) not installed")
def test_the_ring_on_two_mpi_ranks_equals_allreduce():
    result = run_on_ranks(solution("17.ring_allreduce"), ranks=2, length=1001)
    assert result.difference == [0.0, 0.0] and result.sent == [8 * 1001] * 2
    assert result.source == "the package's reference ring"  # no cell to read: its solution's source


@pytest.mark.skipif(not mpi_available(), reason="mpi4py and mpiexec (smallem[ranks]) not installed")
def test_a_failing_ring_on_mpi_ranks_is_one_sentence(tmp_path, monkeypatch):
    source = "def ring_allreduce(grads, send):\n    raise ValueError('boom')\n"
    monkeypatch.setattr(mpi_ring, "_source", lambda ring: (source, "ring_allreduce", "your ring_allreduce"))
    with pytest.raises(SmallemError, match=r"ring_allreduce raised ValueError \(boom\) on the MPI ranks"):
        run_on_ranks(solution("17.ring_allreduce"), ranks=2, length=10)


@pytest.mark.parametrize("mutation", [
    ("send(r, (r + 1) % n, parts[r][(r - s) % n])", "send((r + 1) % n, r, parts[r][(r - s) % n])"),
    ("send(r, (r + 1) % n, parts[r][(r + 1 - s) % n])", "send((r + 1) % n, r, parts[r][(r + 1 - s) % n])"),
    ("send(r, (r + 1) % n, parts[r][(r - s) % n])", "send(r, (r - 1) % n, parts[r][(r - s) % n])"),
    ("send(r, (r + 1) % n, parts[r][(r + 1 - s) % n])", "send(r, (r - 1) % n, parts[r][(r + 1 - s) % n])"),
])
def test_a_ring_told_to_turn_both_ways_is_refused(mutation):
    """Mutants whose sums are right but whose messages are declared the wrong way round in one
    half (tests/mutants_equivalent.py lists them as equivalent in output): the grader refuses them."""
    import numpy as np

    from smallem.course import grade
    from smallem.course.common.grading import EXERCISES

    old, new = mutation
    source = EXERCISES["17.ring_allreduce"].solution_cell
    assert old in source
    namespace = {"np": np}
    exec(source.replace(old, new, 1), namespace)  # noqa: S102
    verdict = grade("17.ring_allreduce", namespace["ring_allreduce"])
    assert not verdict.ok and "both ways round the ring" in str(verdict)
