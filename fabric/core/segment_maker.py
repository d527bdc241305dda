"""Segments faulted in on a thread of their own, for a pool (``fabric.core.segment_pool``,
``SegmentPool._make``): a device's pool makes the segment a slot request needs there, so that
its ops never wait for the fault-in (256 MiB: about 0.13 s on 4 KiB pages, beside 0.02 s for a
warm copy of it).

Rule: the maker only faults pages in (``Segment.allocate``); every decision (which segment,
what it is charged to, whom it is lent to) is its pool's, taken in the pool's own thread: the
pool reserves the bytes as it asks (so its limits hold while a segment is being made), and
adopts what was made, or takes back the bytes of what failed, at its next look
(``SegmentPool.reclaim``). One segment is
faulted in at a time, so the thread takes at most one core. ``wake``, where given, is called
(from the maker's thread) after each segment, for a pool whose thread sleeps in a poll.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from fabric.core.shm import Segment

_CLOSE_SECONDS = 10.0  # how long ``close`` waits for the segment being faulted in


class SegmentMaker:
    """A thread that allocates and faults in the segments it is handed (``submit``), one at
    a time, in order (but those handed ``first``); ``done`` holds each one made, with the
    OSError that failed it, if one did. With ``lowest_priority``, the thread runs at nice 19:
    it yields its core to other work, yet goes on (each populate holds the memory map lock
    that an ``mmap`` elsewhere waits for)."""

    def __init__(self, wake: Callable[[], None] | None = None,
                 lowest_priority: bool = False) -> None:
        self.done: deque[tuple[Segment, OSError | None]] = deque()
        self._wake = wake
        self._lowest_priority = lowest_priority
        self._jobs: deque[tuple[Segment, threading.Event] | None] = deque()
        self._queued = threading.Condition()  # (notified as a job is queued)
        self._thread: threading.Thread | None = None
        self._closing = False

    def submit(self, segment: Segment, first: bool = False) -> threading.Event:
        """Fault ``segment`` in on the maker's thread (started at the first); the event is
        set once it is in ``done``. ``first``: before those waiting (a slot an upload may
        be about to take, where they were made ahead of a need that may not come)."""
        self.start()
        made = threading.Event()
        self._queue((segment, made), first)
        return made

    def start(self) -> None:
        """Start the maker's thread, if it is not running."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fabric-segment-maker",
                                            daemon=True)
            self._thread.start()

    def _queue(self, job: tuple[Segment, threading.Event] | None, first: bool = False) -> None:
        with self._queued:
            (self._jobs.appendleft if first else self._jobs.append)(job)
            self._queued.notify()

    def _run(self) -> None:
        if self._lowest_priority:  # (Linux sets a thread's own nice so)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._queued:
                self._queued.wait_for(lambda: self._jobs)
                job = self._jobs.popleft()
            if job is None:
                return
            self._make(*job)
            job = None  # (no reference kept while waiting: its pool may close it meanwhile)

    def _make(self, segment: Segment, made: threading.Event) -> None:
        failed: OSError | None = None
        if self._closing:  # (its pool closes it: no fault-in for nothing)
            failed = OSError("the pool closed")
        else:
            try:
                segment.allocate()
            except OSError as exc:  # no memory left for it
                failed = exc
        self.done.append((segment, failed))
        made.set()
        if self._wake is not None:
            self._wake()

    def close(self) -> None:
        """Stop: the segment being faulted in is finished (waited for, within
        ``_CLOSE_SECONDS``: its pool then closes it, and no fault may touch an address it
        unmapped), the others are not."""
        self._closing = True
        if self._thread is not None:
            self._queue(None)
            self._thread.join(_CLOSE_SECONDS)
            self._thread = None
