"""The client's pending-request table, sans I/O.

Rule: replies are matched to requests by request id alone, in whatever order they arrive;
a session-level ``SessionLost`` ERROR (say, its worker was lost) loses the session's life
(``fabric.core.session_life``), so that every later call on it fails at once with the same
typed error; a CREDIT is remembered as the count of the session's SUBMITs its device has run.
"""

from __future__ import annotations

import itertools

from fabric.core.errors import SessionLost, error_from_wire
from fabric.core.protocol import Kind, Message
from fabric.core.session_life import ConnectionLife


class PendingTable:
    """Requests in flight, replies not yet taken, and the news of sessions' runs and losses."""

    def __init__(self, life: ConnectionLife | None = None) -> None:
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        self._replies: dict[int, Message] = {}
        # The connection's life, which carries its sessions' (None: a new one, the table's own)
        self.life = ConnectionLife() if life is None else life
        self.done: dict[int, int] = {}  # session -> SUBMITs its device has run (CREDIT)

    def new_request(self) -> int:
        """Allocate a request id and start waiting for its reply."""
        request = next(self._ids)
        self._waiting.add(request)
        return request

    def on_message(self, message: Message) -> None:
        """File an incoming message: a reply to a waiting request, or news about a session."""
        if message.request in self._waiting:
            self._waiting.discard(message.request)
            self._replies[message.request] = message
        elif message.kind == Kind.CREDIT:
            done = message.body["done"]  # (counts only grow; a late CREDIT says less)
            self.done[message.session] = max(done, self.done.get(message.session, 0))
        elif message.kind == Kind.ERROR and message.session:
            error = error_from_wire(message.body)
            if isinstance(error, SessionLost):
                # The first notice names the cause (worker lost, closed by an administrator):
                # later ones, which only say the broker no longer knows the session, change
                # nothing (``PHASE_AFTER``).
                self.life.lose_session(message.session, error)
        # Anything else (a liveness PING, a reply to a request given up on) needs no answer.

    def waits_for(self, request: int) -> bool:
        """Whether ``request``'s reply is awaited (not come, nor given up on)."""
        return request in self._waiting

    def take(self, request: int) -> Message | None:
        """The reply to ``request`` if it has arrived."""
        return self._replies.pop(request, None)

    def forget(self, request: int) -> None:
        """Stop waiting for ``request`` (its deadline passed); a late reply is dropped."""
        self._waiting.discard(request)
        self._replies.pop(request, None)
