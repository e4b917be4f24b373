"""Starting ranks: `mpiexec -n N` (MPICH's, from its PyPI wheel beside this interpreter) running
this same interpreter, each rank with its share of the cores. `spawn` runs a command line and says
in one sentence how a failed run ended (mpiexec's banner left out); `run` calls a function on N
ranks (worker.py) and returns what each returned: what a notebook uses, and ranks.train/bench.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import SmallemError
from .buckets import BUCKET_BYTES
from .world import INSTALL


def mpiexec() -> str:
    """The mpiexec of MPICH's wheel beside this interpreter, else one on PATH; or one sentence."""
    if importlib.util.find_spec("mpi4py") is None:
        raise SmallemError(f"--ranks runs its ranks through MPI, and mpi4py is not installed: "
                           f"{INSTALL}")
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        raise SmallemError(f"--ranks needs mpiexec, and none is beside {sys.executable} nor on "
                           f"PATH: {INSTALL}")
    return found


def _version(launcher: str) -> str:
    try:
        return subprocess.run([launcher, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def environment(n: int) -> dict[str, str]:
    """Each rank's share of the threads the CPU's one decision gives (backends/cpu/threads.py:
    SMALLEM_THREADS, else the cores the machine's load leaves free), for smallem's team and
    NumPy's BLAS alike (unless the caller chose), so N ranks do not start N × cores threads,
    nor spin on cores another program keeps busy."""
    from ..backends.cpu.threads import ENV, decide

    env = dict(os.environ)
    share = str(max(1, decide()[0] // n))
    env[ENV] = share  # SMALLEM_THREADS (or --threads) is the run's total: each rank takes 1/N
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, share)
    return env


def oversubscribed(n: int) -> str | None:
    """The sentence said when there are more ranks than cores (allowed: they take turns)."""
    have = cores()
    if n <= have:
        return None
    return (f"{n} ranks on {have} core{'s' * (have > 1)}: allowed, but they take turns on the "
            f"cores, so each step is slower than with {have} rank{'s' * (have > 1)}")


def launch_command(launcher: str, n: int, arguments: Sequence[str]) -> list[str]:
    """mpiexec's command line for N ranks of `this python ARGUMENTS`. Open MPI's mpiexec (a
    system one) binds each rank to one core when N <= 2 (to a socket past that): a rank given
    cores/N threads would run them all on one core. It is told not to bind, as MPICH's hydra
    does not, and to allow more ranks than cores (said beforehand), which MPICH allows."""
    extra: list[str] = []
    banner = _version(launcher)  # Open MPI 4 says "mpiexec (OpenRTE) 4.1.6", 5 "(Open MPI)"
    if any(name in banner for name in ("Open MPI", "OpenRTE", "open-mpi.org")):
        extra = ["--bind-to", "none", *(["--oversubscribe"] if oversubscribed(n) else [])]
    return [launcher, *extra, "-n", str(n), sys.executable, *arguments]


def spawn(n: int, arguments: Sequence[str], *, what: str = "the run",
          timeout: float | None = None) -> int:
    """Run `this python ARGUMENTS` as N ranks, its output passed through; mpiexec's banner on a
    failure becomes one sentence on stderr. Ctrl-C reaches every rank (they stop together, after
    the step under way); here it only waits for them. Returns the exit status."""
    launcher = mpiexec()
    said = oversubscribed(n)
    command = launch_command(launcher, n, arguments)
    if said:
        print(f"smallem: {said}", file=sys.stderr)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env=environment(n))
    seen: list[str] = []
    reader = threading.Thread(target=_pass_through, args=(process.stdout, seen), daemon=True)
    reader.start()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the ranks decide how to stop
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
        seen.append(f"EXIT STRING: timed out after {timeout:g} s")
    finally:
        signal.signal(signal.SIGINT, previous)
    reader.join(timeout=5)
    if seen:
        print(f"smallem: {ended(n, seen, code, what)}", file=sys.stderr)
    return code


def _pass_through(stream: Any, seen: list[str]) -> None:
    """Forward the ranks' stdout line by line until mpiexec's failure banner begins; keep the
    banner's lines to read how the run ended."""
    banner, out = False, getattr(sys.stdout, "buffer", None)
    for raw in iter(stream.readline, b""):  # bytes as they came: a sample's \r stays a \r
        line = raw.decode("utf-8", "replace")
        banner = banner or line.startswith("====")
        if line.startswith("[mpiexec@"):  # hydra passing Ctrl-C on: the ranks say how they stop
            continue
        if banner:
            seen.append(line.strip())
        elif out is not None:
            sys.stdout.flush()
            out.write(raw)
            out.flush()
        else:  # a notebook's stdout: text only
            sys.stdout.write(line)


def ended(n: int, banner: Sequence[str], code: int, what: str) -> str:
    """One sentence from mpiexec's banner: which way a rank ended, and that the others stopped."""
    text = " ".join(banner)
    how = re.search(r"EXIT STRING: (.*?)(?: This typically| Please see|$)", text)
    status = re.search(r"EXIT CODE: (\d+)", text)
    reason = how.group(1).strip() if how else f"exit status {status.group(1) if status else code}"
    return (f"a rank of {n} ended {what} ({reason}); mpiexec stopped the others: a checkpoint "
            "is written atomically, so the last one saved is whole (--resume it)")


def run(n: int, function: str, *args: Any, timeout: float = 120.0) -> list[Any]:
    """`function(world, *args)` on N ranks started by mpiexec ("package.module:name", importable
    in a fresh interpreter); each rank's return value, in rank order (what they return must
    pickle: numbers, lists, dicts, NumPy arrays). A rank that fails raises one SmallemError."""
    if not re.fullmatch(r"[\w.]+:\w+", function):
        raise SmallemError(f"run: name the function as 'module:name', got {function!r}")
    with tempfile.TemporaryDirectory(prefix="smallem-ranks-") as folder:
        inputs, outputs = Path(folder, "in.pkl"), Path(folder, "out.pkl")
        inputs.write_bytes(pickle.dumps((function, args)))
        code = spawn(n, ["-m", "smallem.ranks.worker", str(inputs), str(outputs)],
                     what=f"running {function}", timeout=timeout)
        if not outputs.exists():
            raise SmallemError(f"{function} on {n} ranks ended with status {code} and returned "
                               "nothing: its error is printed above")
        results = pickle.loads(outputs.read_bytes())  # noqa: S301 - written by our own ranks
    if isinstance(results, BaseException):
        raise results
    return results


def ranks_of_train(n: int, argv: Sequence[str]) -> int | None:
    """`smallem train --ranks N`: started by mpiexec already, check N and go on as a rank (None);
    N = 1, go on as one process (None); else start N ranks of the same command line here, wait
    for them, and return their exit status."""
    from .world import launched, world

    if not isinstance(n, int) or n < 1:
        raise SmallemError(f"--ranks must be a whole number of at least 1, got {n!r}")
    if launched():
        started = world().size
        if started != n:
            raise SmallemError(f"--ranks {n}, but mpiexec started {started} process"
                               f"{'es' * (started > 1)}: make them agree, or drop --ranks "
                               "under mpiexec")
        return None
    if n == 1:
        return None
    return spawn(n, ["-m", "smallem", *argv], what="the run")


def train(config: Any, n: int, **options: Any) -> dict[str, Any]:
    """`smallem.training.train(config, **options)` on N ranks started here (a TrainConfig;
    options such as save=, resume=, log=None): rank 0's result as JSON (TrainResult.to_json(),
    with "ranks": N). The ranks' log lines come through this process's stdout."""
    return run(n, "smallem.training.on_ranks:train_json", config.to_json(), options,
               timeout=options.pop("timeout", 3600))[0]


def bench(n: int, config: Any, *, steps: int = 20, warmup: int = 3,
          bucket_bytes: int = BUCKET_BYTES, timeout: float = 600) -> list[dict[str, Any]]:
    """The data-parallel step of `config` (a TrainConfig; its batch is the global batch) on N
    ranks, plain order then overlap: rank 0's median step in ms, split into compute and the wait
    for the all-reduce, and the all-reduce of the same buffer alone (training/on_ranks.py)."""
    return run(n, "smallem.training.on_ranks:time_split", config.to_json(), steps, warmup,
               bucket_bytes, timeout=timeout)[0]
