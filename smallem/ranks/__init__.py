"""Data parallel on existing engines: one process per rank, started by MPI's `mpiexec` (mpi4py,
MPICH's wheel) on CPUs; gradients summed across ranks by an all-reduce, the accumulate of
backprop one level up (a weight used by N ranks receives the sum of their gradients). The
training step that uses it is training/ranked.py; `smallem train --ranks N` starts the ranks.
"""

from .buckets import BUCKET_BYTES, Buckets
from .launch import bench, mpiexec, run, spawn, train
from .world import MpiWorld, Solo, World, gather_bytes, launched, ring_bytes, rows, world

__all__ = ["world", "World", "Solo", "MpiWorld", "launched", "rows", "ring_bytes", "gather_bytes",
           "Buckets", "BUCKET_BYTES", "run", "spawn", "mpiexec", "train", "bench"]
