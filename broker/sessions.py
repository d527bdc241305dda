"""Session life in the broker: the one table of phase changes, and the indexes of sessions.

Rule: a session's phase changes only in ``SessionTable.move``, by ``PHASE_AFTER`` (as h11's
``_state.py`` keeps its transitions): an event a phase has no entry for is not applied, and
the caller asks ``allows`` first. Entering OPENING or CLOSING starts the deadline by which
the worker must answer (``Limits.open_timeout``); a session that ENDS leaves every index at
once (the table, its client's set, its device's count, its worker's set) and its traffic is
folded into its device's totals. Messages are composed by the registry, not here.
"""

from __future__ import annotations

import enum
from collections import Counter

from .model import Limits, Session, SessionPhase, Worker
from .worker_table import WorkerTable

OPENING, OPEN, CLOSING, ENDED, RESUMABLE = (
    SessionPhase.OPENING, SessionPhase.OPEN, SessionPhase.CLOSING, SessionPhase.ENDED,
    SessionPhase.RESUMABLE)


class SessionEvent(enum.Enum):
    """What moves a session from one phase to the next."""

    OPENED = "opened"  # its worker opened it
    REFUSED = "refused"  # its worker refused to open it (ERROR or REJECT while opening)
    CLOSE = "close"  # its client asked to close it
    CLOSED = "closed"  # its worker closed it
    DEADLINE = "deadline"  # its worker did not answer OPEN or CLOSE in time
    ENDED_BY_BROKER = "ended_by_broker"  # its client or worker is gone, cut, or an admin's
    RESUMED = "resumed"  # its client showed its secret (``broker.resume``)
    CLIENT_LOST = "client_lost"  # a pair's broker lost its client's link: it may come back


PHASE_AFTER: dict[tuple[SessionPhase, SessionEvent], SessionPhase] = {
    (OPENING, SessionEvent.OPENED): OPEN,
    (OPENING, SessionEvent.REFUSED): ENDED,
    # A client that gives up on its handshake is answered at once (the worker may still open
    # it, so the broker closes it there too).
    (OPENING, SessionEvent.CLOSE): ENDED,
    (OPEN, SessionEvent.CLOSE): CLOSING,
    (CLOSING, SessionEvent.CLOSE): CLOSING,  # asked again: the newest CLOSE is answered
    (CLOSING, SessionEvent.CLOSED): ENDED,
    (OPENING, SessionEvent.DEADLINE): ENDED,
    (CLOSING, SessionEvent.DEADLINE): ENDED,  # the worker is slow: the close succeeds anyway
    (OPENING, SessionEvent.ENDED_BY_BROKER): ENDED,
    (OPEN, SessionEvent.ENDED_BY_BROKER): ENDED,
    (CLOSING, SessionEvent.ENDED_BY_BROKER): ENDED,
    # Reported by its worker after a takeover, or its client's link lost (a pair's broker
    # only): its client takes it up, or it ends unclaimed.
    (OPEN, SessionEvent.CLIENT_LOST): RESUMABLE,
    (RESUMABLE, SessionEvent.RESUMED): OPEN,
    (RESUMABLE, SessionEvent.DEADLINE): ENDED,
    (RESUMABLE, SessionEvent.ENDED_BY_BROKER): ENDED,
}

_WAITS_FOR_WORKER = frozenset({OPENING, CLOSING})  # the phases with the worker's deadline


class SessionTable:
    """Every live session by id, by client and per device, moved through ``PHASE_AFTER``."""

    def __init__(self, sessions: dict[int, Session], workers: WorkerTable,
                 limits: Limits) -> None:
        self.sessions = sessions  # the registry's table, which only this object changes
        self.by_client: dict[bytes, set[int]] = {}  # client identity -> its sessions
        # Client identity -> its last PING: liveness per connection, so that a PING costs
        # the same however many sessions the client holds (kept while it holds any).
        self._client_pinged: dict[bytes, float] = {}
        # Client identity -> when to ask it whether it is still there (its connection closed)
        self._to_ask: dict[bytes, float] = {}
        self.next_ask = float("inf")  # the earliest of them
        self._per_device: Counter[tuple[bytes, int]] = Counter()  # (worker, local) -> count
        # (client token, worker, local) -> count: what one token holds on one device.
        self._per_token: Counter[tuple[int, bytes, int]] = Counter()
        self._workers = workers
        self._limits = limits

    def open(self, session: Session, worker: Worker, now: float) -> None:
        """Add a session that its HELLO just opened (it is OPENING)."""
        session.phase = OPENING
        session.deadline = now + self._limits.open_timeout
        self.sessions[session.id] = session
        worker.sessions.add(session.id)
        self.by_client.setdefault(session.client, set()).add(session.id)
        self._per_device[session.worker, session.local] += 1
        self._per_token[session.token, session.worker, session.local] += 1

    def adopt(self, session: Session, worker: Worker, now: float) -> None:
        """Add a session its worker reported after a takeover (RESUMABLE, no client yet,
        until ``Limits.resume_grace`` from ``now``)."""
        session.phase = RESUMABLE
        session.deadline = now + self._limits.resume_grace
        self.sessions[session.id] = session
        worker.sessions.add(session.id)
        self._per_device[session.worker, session.local] += 1
        self._per_token[session.token, session.worker, session.local] += 1

    def keep_for_resume(self, session: Session, now: float) -> None:
        """An OPEN session whose client's link was lost, on a broker of a pair: RESUMABLE,
        with no client, until ``Limits.resume_grace`` from ``now`` (its client may come back
        over another connection with its secret)."""
        self.move(session, SessionEvent.CLIENT_LOST, now)
        session.deadline = now + self._limits.resume_grace
        self._detach_client(session)
        session.client = b""

    def resume(self, session: Session, client: bytes, now: float) -> None:
        """A RESUMABLE session's client showed its secret: it is OPEN, on ``client``."""
        self.move(session, SessionEvent.RESUMED, now)
        session.client = client
        session.last_seen = now
        self.by_client.setdefault(client, set()).add(session.id)

    def of_client(self, identity: bytes) -> list[Session]:
        """A client's sessions, by id."""
        return [self.sessions[s] for s in sorted(self.by_client.get(identity, ()))]

    def heard_from_client(self, identity: bytes, now: float) -> None:
        """A client's connection said PING: its sessions count as seen at ``now``."""
        if identity in self.by_client:
            self._client_pinged[identity] = now

    def last_seen(self, session: Session) -> float:
        """When a session was last seen: its own traffic, or a PING from its client."""
        return max(session.last_seen, self._client_pinged.get(session.client, session.last_seen))

    def ask_later(self, identity: bytes, when: float) -> None:
        """A client's connection closed: ask it at ``when`` whether it is still there (if it
        holds sessions then: ``to_ask``)."""
        if identity in self.by_client:
            self._to_ask[identity] = when
            self.next_ask = min(self.next_ask, when)

    def to_ask(self, now: float) -> list[tuple[bytes, int]]:
        """The clients due to be asked at ``now``, each with one of its sessions' ids (for
        the PING), each once."""
        due = [(client, min(self.by_client[client]))
               for client, when in self._to_ask.items() if when <= now]
        for client, _ in due:
            del self._to_ask[client]
        self.next_ask = min(self._to_ask.values(), default=float("inf"))
        return due

    def count_of_client(self, identity: bytes) -> int:
        """How many sessions a client connection holds (opening and closing ones too)."""
        return len(self.by_client.get(identity, ()))

    def count_on_device(self, worker: bytes, local: int) -> int:
        """How many sessions a device (worker identity, local index) serves."""
        return self._per_device[worker, local]

    def count_of_token(self, token: int, worker: bytes, local: int) -> int:
        """How many sessions opened with client token ``token`` a device serves."""
        return self._per_token[token, worker, local]

    @staticmethod
    def allows(session: Session, event: SessionEvent) -> bool:
        """Whether ``event`` changes anything in the session's phase."""
        return (session.phase, event) in PHASE_AFTER

    def move(self, session: Session, event: SessionEvent, now: float) -> SessionPhase:
        """Apply ``event`` (which ``allows``); returns the phase the session was in."""
        was = session.phase
        session.phase = phase = PHASE_AFTER[was, event]
        if phase is ENDED:
            self._remove(session)
        else:
            session.deadline = (now + self._limits.open_timeout if phase in _WAITS_FOR_WORKER
                                else float("inf"))
        return was

    def end(self, session: Session) -> SessionPhase:
        """End a session on the broker's own account (``ENDED_BY_BROKER``, which every live
        phase allows and which starts no deadline); returns the phase it was in."""
        return self.move(session, SessionEvent.ENDED_BY_BROKER, now=0.0)

    def _remove(self, session: Session) -> None:
        del self.sessions[session.id]
        self._workers.workers[session.worker].sessions.discard(session.id)
        self._detach_client(session)
        key = (session.worker, session.local)
        self._per_device[key] -= 1
        if self._per_device[key] <= 0:
            del self._per_device[key]
        key_of_token = (session.token, session.worker, session.local)
        self._per_token[key_of_token] -= 1
        if self._per_token[key_of_token] <= 0:
            del self._per_token[key_of_token]
        self._workers.retire(session)

    def _detach_client(self, session: Session) -> None:
        """``session`` is no longer its client's (ended, or its client's link lost)."""
        held = self.by_client.get(session.client)  # (none for a RESUMABLE one)
        if held is not None:
            held.discard(session.id)
        if held is not None and not held:
            del self.by_client[session.client]
            self._client_pinged.pop(session.client, None)
            self._to_ask.pop(session.client, None)  # (next_ask may now be early: harmless)
