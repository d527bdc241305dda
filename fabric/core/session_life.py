"""A client session's life, sans I/O: open, lost with the error that ended it, or closed.

Rule 1: whether a session may still be used is answered by its ``SessionLife`` alone. The op
stream, the ``Session``, the ``Connection`` and its pending-request table all read that one
object; none keeps a flag of its own.
Rule 2: a phase changes only by ``PHASE_AFTER`` (as the broker's sessions change only by
``broker.sessions.PHASE_AFTER``); an event the table has no entry for changes nothing. So the
first loss names the cause that every later call raises, and CLOSED is final.
Rule 3: a connection lives the same life (``ConnectionLife``) and carries the lives of its
sessions: losing the connection loses every session on it, with the connection's error.

A LOST session still takes ops (they are batched, and its error is raised when they are sent
or at the next read); a CLOSED one takes none. No socket, no clock: tests drive it with plain
calls.
"""

from __future__ import annotations

import enum
from threading import get_ident

from fabric.core.errors import FabricError, SessionClosed

ONE_THREAD = ("A fabric session is used only by the thread that connected it: call "
              "fabric.connect() in each thread that issues ops.")


class Phase(enum.Enum):
    """Where a session (or a connection) is in its life, as its client sees it."""

    OPEN = "open"
    LOST = "lost"  # ended by its broker, its worker or its connection: its error says why
    CLOSED = "closed"  # closed by its user (a lost one too): final


class Event(enum.Enum):
    """What moves a life from one phase to the next."""

    LOSS = "loss"  # the broker's SessionLost notice, or the loss of the connection
    CLOSE = "close"  # its user closed it


OPEN, LOST, CLOSED = Phase.OPEN, Phase.LOST, Phase.CLOSED

PHASE_AFTER: dict[tuple[Phase, Event], Phase] = {
    (OPEN, Event.LOSS): LOST,
    (OPEN, Event.CLOSE): CLOSED,
    (LOST, Event.CLOSE): CLOSED,  # (its error stays: why it was lost)
}
# Left out, so changing nothing: a second loss (the first one named the cause), and any event
# after CLOSED.


class Life:
    """A phase, and the error that ended it (None until lost), moved by ``PHASE_AFTER``."""

    __slots__ = ("phase", "error")

    def __init__(self) -> None:
        self.phase = OPEN
        self.error: FabricError | None = None

    def _move(self, event: Event) -> Phase | None:
        """Apply ``event`` where the table has it: the phase it left, or None (no change)."""
        was = self.phase
        after = PHASE_AFTER.get((was, event))
        if after is None:
            return None
        self.phase = after
        return was

    def lose(self, error: FabricError) -> bool:
        """It was lost, for ``error``: whether this was its first loss (``error`` its cause)."""
        if self._move(Event.LOSS) is None:
            return False
        self.error = error
        return True

    def close(self) -> Phase:
        """Its user closed it: the phase it was in (CLOSED: closed already, no change)."""
        was = self._move(Event.CLOSE)
        return CLOSED if was is None else was


class SessionLife(Life):
    """One session's life, and the thread it belongs to: the one that opened it."""

    __slots__ = ("session_id", "thread")

    def __init__(self, session_id: int = 0) -> None:
        super().__init__()
        self.session_id = session_id
        # The thread that may use the session; None once it is CLOSED. The op stream's one test
        # per op, ``get_ident() != life.thread``, so refuses another thread's op and a closed
        # session's at once.
        self.thread: int | None = get_ident()

    def close(self) -> Phase:
        """Its user closed it: every later op is refused. The phase it was in."""
        was = super().close()
        self.thread = None
        return was

    def check_usable(self) -> None:
        """Raise why the calling thread may not use the session: it is closed, or it belongs
        to another thread. (A lost one may still be used: its error comes with its next
        message.)"""
        if self.phase is CLOSED:
            raise SessionClosed(f"Session {self.session_id:#x} is closed: open a new session.")
        if get_ident() != self.thread:
            raise FabricError(ONE_THREAD)


class ConnectionLife(Life):
    """A connection's own life (lost when its broker goes, or before its handshake ends),
    and the lives of the sessions it carries, by id."""

    __slots__ = ("sessions",)

    def __init__(self) -> None:
        super().__init__()
        self.sessions: dict[int, SessionLife] = {}

    def new_session(self, session_id: int) -> SessionLife:
        """The life of a session just opened over this connection (lost already, with the
        connection's error, if the connection is)."""
        life = self.sessions[session_id] = SessionLife(session_id)
        if self.error is not None:
            life.lose(self.error)
        return life

    def forget(self, session_id: int) -> None:
        """A session is closing: the connection no longer carries it (its notices are dropped,
        and its messages, its CLOSE, answer to the connection's life alone)."""
        self.sessions.pop(session_id, None)

    def lose(self, error: FabricError) -> bool:
        """The connection was lost, for ``error``, and so was every session on it (one lost
        before keeps its own error): whether this was the connection's first loss."""
        if not super().lose(error):
            return False
        for life in self.sessions.values():
            life.lose(error)
        return True

    def lose_session(self, session_id: int, error: FabricError) -> None:
        """The broker says session ``session_id`` was lost, for ``error`` (nothing to do for a
        session this connection does not carry)."""
        life = self.sessions.get(session_id)
        if life is not None:
            life.lose(error)

    def error_of(self, session_id: int) -> FabricError | None:
        """Why a message of session ``session_id`` (0: the connection's own) may be neither
        sent nor waited for: the loss of a session the connection carries (the connection's
        own loss is its loss too), else the connection's. None: it may."""
        return self.sessions.get(session_id, self).error
