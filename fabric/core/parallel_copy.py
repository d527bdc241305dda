"""Large copies into and out of shared-memory slots, in pieces on a few threads at once.

Rule: one core's memcpy is not the machine's memory bandwidth, and numpy's ``copyto``
releases the GIL; so a copy of at least ``min_bytes`` is cut into ``threads`` pieces, the
same slice of either side (of their flat elements where both are C-contiguous, else along
their first axis), the caller copies the first and a small pool of threads the others. A
piece no thread has started once the caller's is done, the caller copies itself (on a busy
machine a thread may wait long for a core). A copy of ``STREAMING_BYTES`` or more is cut
only into pieces that large: glibc copies that much with non-temporal stores, and pieces
below it, written through the cache, ran slower together than the whole in one.
Every piece is one ``np.copyto``, so any dtype, layout and byte order comes out as one
``np.copyto`` of the whole would make it; a copy that cannot be cut (a 0-d array, a
broadcast, overlapping sides, too small) is that one ``np.copyto``. The pool's threads
start at ``start`` (where the owner starts them ahead of its first transfer), else at the
first copy that is cut, and are joined at ``close`` (a later copy starts them again), so
nothing outlives its owner: a client's connection
(``fabric.core.segment_pool.SegmentPool``), a worker process (``workers.shared_memory``).

Its settings come from the environment where the owner gives none: ``FABRIC_COPY_THREADS``
(threads per copy, the caller's included; 1 copies as one ``np.copyto``) and
``FABRIC_PARALLEL_COPY_BYTES`` (the smallest copy that is cut).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fabric.core.errors import ConfigError

THREADS_ENV = "FABRIC_COPY_THREADS"
MIN_BYTES_ENV = "FABRIC_PARALLEL_COPY_BYTES"
MAX_DEFAULT_THREADS = 4  # more did not pay on the machines measured (bench/w3_shm.py)
MIN_BYTES = 8 << 20  # smaller copies take about a millisecond: a piece's hand-off weighs
PIECE_ALIGN = 4096  # bytes: pieces start on whole pages of either side
# glibc's x86_non_temporal_threshold on the machines measured (3/4 of the shared cache)
STREAMING_BYTES = 48 << 20


def default_threads(environ: Mapping[str, str] = os.environ) -> int:
    """Threads per copy: ``FABRIC_COPY_THREADS``, or the cores this process may use, at
    most ``MAX_DEFAULT_THREADS``. ConfigError for a value that is not a whole number >= 1."""
    given = environ.get(THREADS_ENV)
    if given is None:
        return max(1, min(len(os.sched_getaffinity(0)), MAX_DEFAULT_THREADS))
    return _whole_number(THREADS_ENV, given, 1)


def default_min_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The smallest copy that is cut: ``FABRIC_PARALLEL_COPY_BYTES``, or ``MIN_BYTES``."""
    given = environ.get(MIN_BYTES_ENV)
    return MIN_BYTES if given is None else _whole_number(MIN_BYTES_ENV, given, 0)


def _whole_number(name: str, given: str, least: int) -> int:
    try:
        value = int(given)
    except ValueError:
        value = least - 1
    if value < least:
        raise ConfigError(f"{name}={given!r} is not a whole number of at least {least}: "
                          f"set it to one, or unset it for the default.")
    return value


def piece_count(nbytes: int, threads: int) -> int:
    """How many pieces a copy of ``nbytes`` bytes is cut into with ``threads`` threads: one
    each, but below ``STREAMING_BYTES`` apiece only where the whole is below it too."""
    return threads if nbytes < STREAMING_BYTES else max(1, min(threads,
                                                               nbytes // STREAMING_BYTES))


def pieces(target: np.ndarray, source: np.ndarray,
           count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``target`` and ``source`` (of one shape) cut into at most ``count`` pairs of the
    same slice of each: of their flat elements where both are C-contiguous (each piece but
    the last a whole number of ``PIECE_ALIGN`` bytes), else along their first axis; the
    whole pair where neither cut applies."""
    if target.shape != source.shape or target.ndim == 0 or count < 2:
        return [(target, source)]
    if target.flags.c_contiguous and source.flags.c_contiguous:
        target, source = target.reshape(-1), source.reshape(-1)
        align = max(1, PIECE_ALIGN // max(target.itemsize, source.itemsize, 1))
        step = -(-target.shape[0] // count)
        step = -(-step // align) * align
    else:
        step = -(-target.shape[0] // count)
    length = target.shape[0]
    return [(target[start:start + step], source[start:start + step])
            for start in range(0, length, step)] or [(target, source)]


class ParallelCopy:
    """``copy(target, source)``: ``np.copyto`` in ``threads`` pieces at once, for copies of
    at least ``min_bytes`` (defaults: the environment's, ``default_threads`` and
    ``default_min_bytes``). Safe to use from several threads at once."""

    def __init__(self, threads: int | None = None, min_bytes: int | None = None) -> None:
        self.threads = default_threads() if threads is None else threads
        self.min_bytes = default_min_bytes() if min_bytes is None else min_bytes
        if self.threads < 1 or self.min_bytes < 0:
            raise ConfigError(f"A parallel copy takes at least 1 thread and a size of at "
                              f"least 0 bytes, not {self.threads} and {self.min_bytes}.")
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.cut = 0  # copies made in pieces so far

    def copy(self, target: np.ndarray, source: np.ndarray) -> None:
        """``np.copyto(target, source)``; in pieces on the pool's threads where it is large
        enough and can be cut. Returns once every piece is written (the first error of a
        piece is raised then)."""
        if self.threads < 2 or target.nbytes < self.min_bytes \
                or np.may_share_memory(target, source):
            np.copyto(target, source)
            return
        cut = pieces(target, source, piece_count(target.nbytes, self.threads))
        if len(cut) < 2:
            np.copyto(target, source)
            return
        self.cut += 1
        self.each(np.copyto, cut)

    def spans(self, nbytes: int, align: int) -> list[tuple[int, int]]:
        """``nbytes`` bytes cut as ``copy`` cuts a copy: a span (start, length) for each
        thread, each but the last a whole number of ``align`` bytes; one span where a copy
        is not cut (one thread, or fewer than ``min_bytes``, or none)."""
        if self.threads < 2 or nbytes < self.min_bytes or nbytes == 0:
            return [(0, nbytes)]
        step = -(-nbytes // self.threads // align) * align
        return [(start, min(step, nbytes - start)) for start in range(0, nbytes, step)]

    def each(self, copy: Callable[..., Any], cut: Sequence[tuple[Any, ...]]) -> None:
        """``copy(*piece)`` for every piece of ``cut``: the first here, the others on the
        pool's threads (any not started by then, here too). Returns once every piece is
        copied (the first error of a piece is raised then)."""
        if len(cut) < 2:
            copy(*cut[0])
            return
        futures = self._submit(copy, cut[1:])
        try:
            copy(*cut[0])
            for future, piece in zip(futures[::-1], cut[:0:-1]):
                if future.cancel():  # (not started: copied here, not waited for)
                    copy(*piece)
        finally:  # (no piece is still being written once this returns, even on an error)
            errors = [future.exception() for future in futures if not future.cancelled()]
        for error in errors:
            if error is not None:
                raise error

    def _submit(self, copy: Callable[..., Any],
                cut: Sequence[tuple[Any, ...]]) -> list[Future[None]]:
        """``copy`` of each piece of ``cut`` queued for the pool's threads, started now if
        need be (under the lock: a ``close`` meanwhile lets what was queued run first)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1,
                                                thread_name_prefix="fabric-copy")
            return [self._pool.submit(copy, *piece) for piece in cut]

    def start(self) -> None:
        """Start the pool's threads now, where copies are cut (not in a first transfer)."""
        if self.threads > 1:
            self._submit(_started, [()] * (self.threads - 1))

    def close(self) -> None:
        """Join the pool's threads (a later copy starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _started() -> None:
    """A task that only starts a thread of the pool (``ParallelCopy.start``)."""
