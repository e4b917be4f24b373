"""Lesson 17, many devices (notebooks/17_many_devices.ipynb): its exercises (exercises.py), the
simulated devices (ring.py: the wire that counts each device's bytes, the reference ring, the
gather to one), the learner's ring on real MPI ranks (mpi_ring.py, through smallem.ranks) and the
runs it shows where they cannot be made (recorded/).
Its face names them on first use (common.lesson_face), with the learner's `check`, `hint`, ...; it
imports no other lesson."""

from ..common import lesson_face

__getattr__, __dir__ = lesson_face(__name__, "exercises", "ring", "mpi_ring")
