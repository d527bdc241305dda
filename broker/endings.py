"""How sessions end on the broker's own account, and what each side is told.

Rule: when the broker ends a session (its worker or client is gone, its client stopped
reading, its worker missed a deadline, an administrator closed it, the broker stops), the
session's worker gets a CLOSE if it is still there (freeing the session's memory) and its
client one notice chosen by the phase the session was in: a REJECT answering its HELLO while
opening, its CLOSED while closing, an ERROR (``SessionLost``, with the reason) once open.
Each notice says what to do next. Sans I/O, like the registry that calls it. What a client
can make happen at will (its sessions dropped as it vanishes, its sessions cut as it stops
reading) is logged through the registry's rate limit (``log_peer``), given the time.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

from fabric.core.errors import FabricError, HandshakeError, NotFound, SessionLost
from fabric.core.log_limit import peer_label
from fabric.core.protocol import Kind, Message

from .model import (
    Limits,
    Send,
    Session,
    SessionPhase,
    Side,
    Worker,
    send_error,
    send_message,
)
from .sessions import SessionEvent, SessionTable
from .worker_table import WorkerTable

log = logging.getLogger("fabric.broker")


class Endings:
    """Ends sessions for the registry; shares its tables and its counters."""

    def __init__(self, sessions: SessionTable, workers: WorkerTable, counters: Counter[str],
                 rejects: Counter[str], limits: Limits,
                 log_peer: Callable[[int, str, str, float], None] | None = None) -> None:
        self._sessions = sessions
        self._workers = workers
        self.counters = counters
        self.rejects = rejects
        self._limits = limits
        self._log_peer = log_peer  # (level, kind, peer, now): a line through the rate limit

    def _log_client(self, level: int, text: str, now: float | None) -> None:
        """Log a line a client can cause at will: through the rate limit where ``now`` is
        given (naming no connection), else at once."""
        if now is not None and self._log_peer is not None:
            self._log_peer(level, text, "", now)
        else:
            log.log(level, text)

    @staticmethod
    def closed(session: Session) -> Send:
        """The CLOSED that answers a session's CLOSE."""
        return send_message(Side.FRONTEND, session.client, Message(
            Kind.CLOSED, session.id, session.close_request))

    @staticmethod
    def close_on_worker(session: Session, request: int = 0) -> Send:
        """The CLOSE that ends a session on its worker (``request`` 0: nobody waits)."""
        return send_message(Side.WORKERS, session.lane, Message(Kind.CLOSE, session.id, request))

    def _end(self, session: Session, *, opening: FabricError, lost: FabricError) -> Send:
        """End a session on the broker's own account; what tells its client, by the phase it
        was in: ``opening`` is the REJECT of a pending HELLO, ``lost`` the ERROR for an open
        session; a client that was closing gets its CLOSED."""
        was = self._sessions.end(session)
        if was is SessionPhase.OPENING:
            self.rejects[str(opening.details.get("reason", opening.code))] += 1
            return send_error(Side.FRONTEND, session.client, opening, kind=Kind.REJECT,
                              session=session.id, request=session.hello_request)
        if was is SessionPhase.CLOSING:
            return self.closed(session)
        return send_error(Side.FRONTEND, session.client, lost, session=session.id)

    def lose_worker(self, worker: Worker, why: str) -> list[Send]:
        """Forget a worker and tell every client with a session on it."""
        log.warning("worker %s lost: %s", worker.name, why)
        self.counters["workers_lost"] += 1
        sends: list[Send] = []
        for session_id in sorted(worker.sessions):
            session = self._sessions.sessions[session_id]
            if session.phase is SessionPhase.RESUMABLE:  # (no client to tell yet)
                self._sessions.end(session)
                continue
            device = session.device
            sends.append(self._end(session, opening=HandshakeError(
                f"Worker {worker.name} owning device {device} was lost while the session "
                f"was opening ({why}): retry, or choose another device.",
                device=device, worker=worker.name, reason="worker_lost"), lost=SessionLost(
                f"Session {session.id:#x} on device {device} is lost: worker "
                f"{worker.name} {why}. Open a new session.",
                device=device, worker=worker.name, session=session.id)))
        self._workers.remove(worker)
        return sends

    def lose_client(self, identity: bytes, why: str, now: float | None = None,
                    resumable: bool = False) -> list[Send]:
        """End a vanished client's sessions: closed on their workers, nobody else told (said
        through the rate limit at ``now``, if given). With ``resumable`` (a broker of a
        pair), an open session whose secret the broker knows waits for its client instead,
        RESUMABLE for the resume grace: its link may have broken while the client lives."""
        sends: list[Send] = []
        for session in self._sessions.of_client(identity):
            if (resumable and now is not None and session.secret_digest
                    and self._sessions.allows(session, SessionEvent.CLIENT_LOST)):
                log.debug("session %#x kept to be resumed: %s", session.id, why)
                self._sessions.keep_for_resume(session, now)
                continue
            log.debug("session %#x dropped: %s", session.id, why)  # (ids at DEBUG only)
            self.counters["sessions_expired"] += 1
            self._sessions.end(session)
            sends.append(self.close_on_worker(session))
        if sends:
            self._log_client(logging.INFO, f"{len(sends)} session(s) dropped: {why}", now)
        return sends

    def cut_client(self, identity: bytes, queued: int, now: float | None = None) -> list[Send]:
        """End every session of a client that left ``queued`` messages unread, the most the
        broker holds for one peer: closed on their workers (freeing their memory), and a
        notice for each, which reaches the client only if it reads again. A client with no
        session left is not cut again: its queue filled with answers about sessions it was
        cut from (its last words left the broker, which does not mean it read them)."""
        sessions = self._sessions.of_client(identity)
        if not sessions:
            return []
        self.counters["clients_cut"] += 1
        self._log_client(logging.WARNING, f"a client left {queued} messages unread: its "
                         f"{len(sessions)} session(s) are ended", now)
        log.debug("the client cut off is connection %s", peer_label(identity))
        sends: list[Send] = []
        for session in sessions:
            self.counters["sessions_cut"] += 1
            sends.append(self.close_on_worker(session))
            sends.append(self._end(session, opening=HandshakeError(
                f"The broker ended the session while it was opening: the client left "
                f"{queued} messages unread. Read replies as they come, then open a new "
                "session.", reason="client_not_reading"), lost=SessionLost(
                f"Session {session.id:#x} was ended by the broker: the client left {queued} "
                "messages unread, the most the broker holds for one client. Read replies "
                "as they come (one connection per thread), then open a new session.",
                session=session.id, reason="client_not_reading")))
        return sends

    def expire(self, session: Session, now: float) -> list[Send]:
        """A session's worker did not answer its OPEN or CLOSE in time, or a session its
        worker reported after a takeover was not resumed in time (closed there)."""
        if session.phase is SessionPhase.RESUMABLE:
            self._sessions.move(session, SessionEvent.DEADLINE, now)
            self.counters["sessions_not_resumed"] += 1
            return [self.close_on_worker(session)]
        if self._sessions.move(session, SessionEvent.DEADLINE, now) is SessionPhase.CLOSING:
            return [self.closed(session)]  # the client's close succeeds anyway
        self.rejects["open_timeout"] += 1
        return [self.close_on_worker(session), send_error(
            Side.FRONTEND, session.client, HandshakeError(
                f"The worker did not open the session within "
                f"{self._limits.open_timeout:g} s: retry, or choose another device.",
                reason="open_timeout"),
            kind=Kind.REJECT, session=session.id, request=session.hello_request)]


    def close_by_admin(self, session_id: int) -> list[Send]:
        """End a session for an administrator: closed on its worker, its client told.

        Raises NotFound, changing nothing, when the broker has no such session.
        """
        session = self._sessions.sessions.get(session_id)
        if session is None:
            raise NotFound(f"Session {session_id:#x} does not exist on this broker: list the "
                           "open ones with fabric admin sessions.", session=session_id)
        device = session.device
        sends = [self.close_on_worker(session), self._end(session, opening=HandshakeError(
            f"The session on device {device} was closed by an administrator while it was "
            "opening: open a new session.", device=device, reason="closed_by_admin"),
            lost=SessionLost(
            f"Session {session.id:#x} on device {device} was closed by an administrator: "
            "open a new session.", device=device, session=session.id,
            reason="closed_by_admin"))]
        self.counters["sessions_closed_by_admin"] += 1
        log.debug("session %#x closed by an administrator", session.id)
        return sends

    def shutdown(self) -> list[Send]:
        """Tell every client its session ends because the broker stops."""
        return [send_error(Side.FRONTEND, session.client, SessionLost(
            "The broker is shutting down: open a new session when it is back.",
            session=session.id), session=session.id)
            for session in self._sessions.sessions.values()]
