"""Slots a session's device lends ahead of its uploads (``fabric.transport.bulk``), so that an
upload does not wait for the device's queued work.

Rule: an upload never asks and waits. It takes a slot whose answer has already come
(``take``), else waits (a bounded time) for the answer to one asked for before, that fits,
else goes through the client's own pool, and asks for the next slot without
waiting (``wanted``, ``ask``): the device's thread answers after the op it is running (a
worker runs a lone ``shm_slot`` ahead of its session's queued messages:
``workers.lane.jumps_the_queue``), with a free segment that fits, or else once its pool's
thread made one (``workers.device_pool``). Answers are looked at only when an upload comes, and
those never taken are forgotten when the session closes (``forget``). What a session holds
ahead is bounded: ``PER_SIZE`` slots (asked or arrived) that fit one size, ``IN_ALL`` in
all. An arrived slot unused for the pool's idle period, or pushed out by another size, goes
back to the device with the next request (``request``); the rest go back when the session
closes (the worker gives back what a closed session was offered and never used).

Sizes: an upload takes the smallest arrived slot that ``fits`` it (at least its bytes, at
most twice as many); its put names the slot's start and the array's own bytes, so the tensor
is exactly the array's shape and dtype, and keeps the whole slot until it is freed.

The start slot: as a connection's first session opens, right behind its probe, it asks for
one slot of ``SharedMemory.start_slot`` bytes (``request``'s ``start``), for its first
upload: a user's first upload is the common case, and one written into a slot lent ahead
and faulted in here is one copy, where any other waits for its device. It takes an upload
that ``fits`` it, as any slot (16 MiB by default: 8 to 16 MiB), and its device lends a
bounded number of them at once (``workers.device_pool``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, NamedTuple

from fabric.core.shm import fits
from fabric.core.wire import SegmentRef

PER_SIZE = 2  # slots asked or arrived that fit one size: one in use, one on its way
IN_ALL = 4  # slots asked or arrived, whatever their sizes


class Arrived(NamedTuple):
    """A slot the device lent, not yet used, and when its answer was taken."""

    ref: SegmentRef
    since: float


class SizesSeen:
    """The last ``IN_ALL`` sizes of one kind of transfer a session made (``again``)."""

    def __init__(self) -> None:
        self.sizes: deque[int] = deque(maxlen=IN_ALL)

    def again(self, nbytes: int) -> bool:
        """Whether a transfer of ``nbytes`` bytes came before (a loop's); remembered now.
        (A first upload read from the client's memory asks for no slot ahead, and a first
        read is written into new memory of the client's: ``fabric.transport.bulk``.)"""
        if nbytes in self.sizes:
            return True
        self.sizes.append(nbytes)
        return False

    def __contains__(self, nbytes: int) -> bool:
        """Whether a transfer of ``nbytes`` bytes came before (nothing remembered)."""
        return nbytes in self.sizes


class SlotsAhead:
    """One session's slots lent ahead: asked (request id -> bytes asked), arrived, and those
    to give back with the next request; ``used`` and ``missed`` count the uploads that found
    a slot arrived and those that did not."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.asked: dict[int, int] = {}
        self.arrived: list[Arrived] = []  # in the order they came
        self.returning: list[SegmentRef] = []  # (also an unused upload buffer's: bulk)
        self.used = 0
        self.missed = 0
        self.read_from_memory = SizesSeen()  # of the uploads and moves read out of memory
        # (and of a first upload written into the start slot)
        self._clock = clock

    def on_answer(self, request: int, ref: SegmentRef | None) -> None:
        """``request`` was answered: with the slot it lends, or None (the device's pool was
        full)."""
        del self.asked[request]
        if ref is not None:
            self.arrived.append(Arrived(ref, self._clock()))

    def take(self, nbytes: int) -> SegmentRef | None:
        """The smallest arrived slot that fits ``nbytes`` bytes, now the caller's; None
        where none has."""
        fitting = [entry for entry in self.arrived if fits(entry.ref.nbytes, nbytes)]
        if not fitting:
            self.missed += 1
            return None
        entry = min(fitting, key=lambda e: e.ref.nbytes)
        self.arrived.remove(entry)
        self.used += 1
        return entry.ref

    def wanted(self, nbytes: int, idle_seconds: float) -> bool:
        """Whether to ask for a slot of ``nbytes`` bytes now (within the bounds). First the
        arrived slots unused for ``idle_seconds`` are set to go back, and, where the bound
        is reached, the oldest that does not fit ``nbytes``."""
        now = self._clock()
        for entry in [e for e in self.arrived if now - e.since > idle_seconds]:
            self._give_back(entry)
        same = sum(fits(asked, nbytes) for asked in self.asked.values()) \
            + sum(fits(entry.ref.nbytes, nbytes) for entry in self.arrived)
        if same >= PER_SIZE:
            return False
        others = [entry for entry in self.arrived if not fits(entry.ref.nbytes, nbytes)]
        if len(self.asked) + len(self.arrived) >= IN_ALL and others:
            self._give_back(others[0])
        return len(self.asked) + len(self.arrived) < IN_ALL

    def request(self, nbytes: int, start: bool = False) -> dict[str, Any]:
        """The body of a ``shm_slot`` request for ``nbytes`` bytes (``start``: the start
        slot), giving back the slots set to go back (``fabric.core.wire``)."""
        body: dict[str, Any] = {"op": "shm_slot", "nbytes": nbytes}
        if start:
            body["start"] = True
        if self.returning:  # (popped: an upload buffer's finalizer appends from any thread)
            body["give_back"] = [list(self.returning.pop()[:3])
                                 for _ in range(len(self.returning))]
        return body

    def ask(self, request: int, nbytes: int) -> None:
        """A request for a slot of ``nbytes`` bytes was sent as ``request``."""
        self.asked[request] = nbytes

    def forget(self, forget_request: Callable[[int], None]) -> None:
        """The session closed: stop waiting for the answers not taken (``forget_request``),
        and hold nothing (the worker gives back what the session was offered)."""
        for request in self.asked:
            forget_request(request)
        self.asked.clear()
        self.arrived.clear()
        self.returning.clear()

    def _give_back(self, entry: Arrived) -> None:
        self.arrived.remove(entry)
        self.returning.append(entry.ref)
