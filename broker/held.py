"""Messages the broker's I/O loop holds back until a time: the answers to refused tokens.

Rule: sans I/O and bounded. The loop hands over every ``Send`` whose ``not_before`` is set and
sends what ``due(now)`` returns; it polls no longer than ``next_deadline()``. When full, a new
message is dropped and counted (a peer flooding bad tokens goes unanswered) rather than the
queue growing without bound or anything being answered early.
"""

from __future__ import annotations

import heapq
import itertools

from .model import Send

MAX_HELD = 4096  # answers held at once; more only happens when someone floods bad tokens


class HeldSends:
    """A timer queue of ``Send`` items, released in ``not_before`` order."""

    def __init__(self, limit: int = MAX_HELD) -> None:
        self.limit = limit
        self.dropped = 0
        self._heap: list[tuple[float, int, Send]] = []
        self._order = itertools.count()  # ties keep their arrival order

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, send: Send) -> bool:
        """Keep ``send`` until its ``not_before``; False (and counted) when the queue is full."""
        if len(self._heap) >= self.limit:
            self.dropped += 1
            return False
        heapq.heappush(self._heap, (send.not_before, next(self._order),
                                    send._replace(not_before=0.0)))
        return True

    def due(self, now: float) -> list[Send]:
        """Every held message whose time has come, oldest first (to send now)."""
        ready = []
        while self._heap and self._heap[0][0] <= now:
            ready.append(heapq.heappop(self._heap)[2])
        return ready

    def next_deadline(self) -> float:
        """When the next held message is due (infinity when none is held)."""
        return self._heap[0][0] if self._heap else float("inf")
