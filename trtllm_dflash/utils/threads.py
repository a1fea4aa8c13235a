"""torch's intra-op threads, chosen deliberately.

torch starts one thread per core of the machine, not per core this process may use: in a container,
under `taskset`, or beside other processes (tensor-parallel ranks, Triton's own threads) that
oversubscribes the cores, and every decode step waits at thread barriers for threads that were
descheduled. The default is the cores this process may run on (its CPU affinity) shared among the
ranks that run side by side, at most MAX_DEFAULT_THREADS: decode-sized matmuls gain little past that.
"""

from __future__ import annotations

import os

import torch

from .errors import DFlashError

MAX_DEFAULT_THREADS = 8


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; the machine's count where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_threads(ranks: int = 1) -> int:
    """Threads per rank when `ranks` processes share this process's cores."""
    return max(1, min(available_cores() // max(1, ranks), MAX_DEFAULT_THREADS))


def resolve_threads(threads: int | None, ranks: int = 1) -> int:
    """--threads N as given (at least 1), or the default for `ranks` processes."""
    if threads is None:
        return default_threads(ranks)
    if threads < 1:
        raise DFlashError(f"--threads must be at least 1, got {threads}")
    return threads


def set_threads(threads: int | None, ranks: int = 1) -> int:
    """Set torch's intra-op threads; -> the count set."""
    threads = resolve_threads(threads, ranks)
    torch.set_num_threads(threads)
    return threads
