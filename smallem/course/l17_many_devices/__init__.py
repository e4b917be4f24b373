"""Lesson 17, many devices: the course folder of notebooks/17_many_devices.ipynb. Its graders
(exercises.py, registered when this folder is imported, as `smallem.exercises.load_lessons` does),
the simulated devices (ring.py), the learner's ring run on real MPI ranks (mpi_ring.py, started by
`run_on_ranks`) and its recorded runs (runs.py, recorded/)."""

from __future__ import annotations

from . import exercises
from .mpi_ring import RanksResult, mpi_available, run_on_ranks
from .ring import Wire, chunk_bounds, naive_allreduce, ring_bytes, ring_reference
from .runs import recorded

__all__ = ["RanksResult", "Wire", "chunk_bounds", "exercises", "mpi_available", "naive_allreduce",
           "recorded", "ring_bytes", "ring_reference", "run_on_ranks"]
