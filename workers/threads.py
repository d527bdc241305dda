"""How many threads a worker's devices let numpy's BLAS, OpenMP and numexpr use.

Rule: a worker sets one thread count for its process at start (``--threads``), for the
pools its devices call into: the BLAS library's and OpenMP's (through threadpoolctl, which
finds whichever BLAS numpy loaded) and numexpr's. Left to themselves these start one thread
per core of the machine, and OpenBLAS's threads spin between calls: a loop of small matmuls
then keeps every core busy, so the client and broker on the same host, and the worker's own
device and I/O threads, wait for a core (bench/programs.py's MLP on a busy 2-core machine:
1.35 s of worker CPU for 0.13 s of work, and a read that timed out). The default is the
cores this process may run on shared among its devices.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits

_chosen: int | None = None  # the count set by limit_threads (None: the pools' own)


def limit_threads(threads: int) -> None:
    """Let the BLAS and OpenMP pools of this process use ``threads`` threads, and numexpr's
    once a numexpr device starts (``limited_to``: a numpy worker never loads numexpr)."""
    global _chosen
    threadpool_limits(limits=threads)
    _chosen = threads


def limited_to() -> int | None:
    """The count ``limit_threads`` set (None: it was not called, the pools keep their own)."""
    return _chosen
