"""How many threads the CPU runs: one decision for BLAS and smallem's own team (team.py), made when
the float32 backend is first built and again at the start of every run (train(), each bench row).
SMALLEM_THREADS or `--threads N` (which sets it) decide the team, up to four threads a usable CPU
(at least 64: most_asked()); otherwise the physical cores this process may use, less those the
machine's load average says are busy, at most most() (16 where the Linears run compiled, else 8),
never fewer than one. BLAS runs one thread on both CPU backends, float32 and cpu64
(one_blas_thread() says why).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import SmallemError
from . import team

ENV = "SMALLEM_THREADS"
# The most threads the default takes. With NumPy's calls for the Linears' pieces, 8: on the
# 16-core host, each row alone, 44.4 ms at 8 threads against 54.8 at 16 (numba's table), 63.4
# against 82.6 on NumPy's (benchmarks/results/round8/cpu.md): past 8 the GIL each piece takes
# back cost more than the cores brought. With the Linears' pieces compiled (compiled_linear.py,
# the GIL once a thread), MOST_COMPILED: 34.9 ms at 16 against 40.8 at 8 (round9/cpu2.md, one
# row each). SMALLEM_THREADS or --threads still ask for more.
MOST = 8
MOST_COMPILED = 16


def most() -> int:
    """The default's cap: MOST_COMPILED where the Linears run compiled, else MOST."""
    from . import compiled

    return MOST_COMPILED if compiled.linear() else MOST


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (taskset, cgroups' cpusets), else all."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int]) -> int:
    """How many physical cores `cpus` span: two hyperthreads of one core share its arithmetic
    units, so a second thread there adds little to GEMMs and elementwise loops. Read from Linux's
    topology files; elsewhere every logical CPU counts as a core."""
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def busy_cores() -> int:
    """Cores the rest of the machine keeps busy: the last minute's load average, rounded
    (0 where the system has none, as on Windows)."""
    try:
        return round(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def most_asked() -> int:
    """The most threads SMALLEM_THREADS or --threads may ask for: four a usable CPU, at least 64.
    More only wait for one another, and each costs a stack: asked for 100,000, the team started
    22,318 on the 2-core machine before the system refused the next (round 17)."""
    return max(64, 4 * len(usable_cpus()))


def too_many(n: int, what: str, undo: str = "leave it out") -> None:
    """One sentence when `n` threads (asked as `what`) is past most_asked()."""
    if n > (limit := most_asked()):
        raise SmallemError(f"{what}: this process may use {len(usable_cpus())} CPUs; give at most {limit} "
                           f"threads (more only wait for one another), or {undo} to let smallem choose")


def requested() -> int | None:
    """SMALLEM_THREADS as a count, None when unset or empty; a bad value is one sentence."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # "²".isdigit(), yet int() refuses it
        raise SmallemError(f"{ENV}={raw!r}: give a whole number of threads, 1 or more "
                           f"(or unset it to let smallem choose)")
    too_many(int(raw), f"{ENV}={raw}", "unset it")
    return int(raw)


def decide() -> tuple[int, str]:
    """(threads, why): SMALLEM_THREADS when set, else min(physical cores, cores not busy, most())."""
    asked = requested()
    if asked is not None:
        return asked, f"{ENV}={asked}"
    cpus = usable_cpus()
    cores, busy = physical_cores(cpus), busy_cores()
    free = min(cores, len(cpus) - busy)
    cap = most() if free > MOST else MOST  # a machine of 8 cores or fewer never imports numba here
    n = max(1, min(free, cap))
    return n, f"{cores} physical cores usable, load average {busy}, at most {cap}"


def settle() -> int:
    """Decide now and apply it: smallem's team gets that many threads, and BLAS one (the team
    splits every float32 product itself: OpenBLAS's own threads gain nothing at these sizes and,
    spinning after each call, take the cores from everything else). Returns the count."""
    n, _ = decide()
    one_blas_thread()
    team.resize(n)
    return n


def team_size() -> int:
    return team.size()


def one_blas_thread() -> None:
    """BLAS to one thread, for the whole process, when either CPU backend is built (numpy.py).

    One rule for both routes, because threadpoolctl's limit is process-wide and a lesson builds
    both in one kernel. The float32 engine needs it: its team splits each product and calls BLAS
    from n threads at once, so BLAS threads of its own would multiply them. cpu64 (plain NumPy, no
    team) is better for it too. On a busy machine OpenBLAS's threads spin for cores that are not
    free: notebook 13's float64 races took 10-15x longer (round14/ci_time.md); under this team's
    load here notebook 13 burnt 18.9 s of CPU against 11.8 at one thread, once 52 s of wall time
    against 12 (round15/lessons/threads.md). On an idle machine BLAS's threads buy cpu64 little at
    the lessons' sizes, where each node's Python outweighs its products (two threads against one,
    best of five: notebook 13's race 5 % faster, notebook 09's 100 steps 0.3 s of 1.4). And one
    thread keeps cpu64 the reference it is: a float64 result's last digits change with BLAS's
    thread count (notebook 13's race ends at 2.4676195251954103 on one, 2.46761952519541 on two),
    so a count taken from the load, as the team's is, would make them depend on what else ran.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an install without it: BLAS keeps its own default
        return
    threadpool_limits(limits=1, user_api="blas")
