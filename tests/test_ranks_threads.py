"""A run on N ranks shares the CPU's one thread decision (backends/cpu/threads.py) out among its
ranks: SMALLEM_THREADS (or --threads) is the run's total, each rank takes its 1/N, BLAS too."""

from __future__ import annotations

from smallem.ranks.launch import environment


def test_each_rank_takes_its_share_of_the_decided_threads(monkeypatch):
    monkeypatch.setenv("SMALLEM_THREADS", "8")
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    env = environment(2)
    assert env["SMALLEM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "4"
    assert environment(3)["SMALLEM_THREADS"] == "2"
    assert environment(16)["SMALLEM_THREADS"] == "1"  # never fewer than one


def test_a_busy_machine_gives_each_rank_what_the_load_leaves(monkeypatch):
    monkeypatch.delenv("SMALLEM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    import smallem.backends.cpu.threads as threads

    monkeypatch.setattr(threads, "busy_cores", lambda: 10_000)  # every core busy
    assert environment(2)["SMALLEM_THREADS"] == "1"
    assert environment(2)["OPENBLAS_NUM_THREADS"] == "1"
