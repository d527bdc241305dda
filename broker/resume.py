"""A takeover's sessions in the broker that takes over, sans I/O: the sessions workers report,
the clients that take them up, and the settling before clients are served.

Rule: a session a worker reports in its REGISTER (``fabric.core.resume``) becomes RESUMABLE,
owned by the client token whose digest the report names (one this broker does not hold
makes it no session), on that worker's device, until ``Limits.resume_grace``; a RESUME
takes it up only with that token and a secret of the reported digest. A session id alone, a
wrong secret, another token: refused with ``ResumeRefused``, counted, and answered
``Limits.auth_delay`` late (guessing costs time; the session stays resumable for its own
client). The broker keeps the secret's digest only, never the secret.

A client's link to the active broker may break while both live (no takeover): a broker of a
pair keeps the digest of each secret it passes on in WELCOME, so its client, back over a new
connection, resumes there too. Seen gone (unroutable) first, the client's open sessions wait
RESUMABLE for the resume grace instead of ending; not seen gone yet, a RESUME with the
secret moves the open session to the new connection. Either way what had no answer is sent
again, and the device's sequence numbers and record of replies keep it from running twice.

Settling: a broker of a pair that began serving answers clients (HELLO, DEVICES, RESUME of a
session it does not know) only once every worker of the last known table (the device
numbering the pair's state file holds) has registered, or ``Limits.settle_time`` has passed
(those still missing are declared lost). Without a known table it serves HELLO and DEVICES
once the first worker registered, but a RESUME of a session no worker reported waits out the
bound (its worker may be on its way). A RESUME of a reported session whose worker registered
but has not attached all its device lanes yet (its device is not online) is refused the same
way. A refusal while settling is marked ``settling``: the client retries.
"""

from __future__ import annotations

import logging
from typing import Any

from fabric.core.errors import FabricError, HandshakeError, ResumeRefused
from fabric.core.protocol import Kind, Message
from fabric.core.resume import decode_reports, secret_matches

from .handshake import size_limit, token_index
from .model import Send, Session, SessionPhase, Side, Worker, send_message
from .pair import refusal

log = logging.getLogger("fabric.broker")


class Settling:
    """Whether a broker that began serving still waits for its workers to report."""

    def __init__(self) -> None:
        self.until = float("-inf")
        self.awaited: set[str] = set()  # worker names of the last known table not yet back
        self.known_table = False
        self.first_came = False  # (without a known table, the first worker ends the wait)

    def begin(self, names: set[str], now: float, bound: float) -> None:
        """Serving began at ``now``: wait for the workers ``names`` (the last known table's;
        empty: not known) for at most ``bound`` seconds."""
        self.until = now + bound
        self.awaited = set(names)
        self.known_table = bool(names)
        self.first_came = False

    def registered(self, name: str) -> None:
        """A worker registered: it is not awaited any more."""
        self.awaited.discard(name)
        self.first_came = True

    def active(self, now: float) -> bool:
        """Whether clients' HELLO and DEVICES must still wait (``awaited`` left past the
        bound are declared lost)."""
        return self._waiting(now) and bool(self.awaited or not (self.known_table
                                                                or self.first_came))

    def unknown_may_come(self, now: float) -> bool:
        """Whether a session no worker reported yet may still be reported."""
        return self._waiting(now) and bool(self.awaited or not self.known_table)

    def _waiting(self, now: float) -> bool:
        if now < self.until:
            return True
        if self.awaited:
            log.warning("pair: worker(s) %s did not register within the settle time: "
                        "declared lost", ", ".join(sorted(self.awaited)))
            self.awaited.clear()
        return False

    def mark(self, error: FabricError) -> FabricError:
        """``error`` told as a refusal to retry in a moment (``settling``)."""
        error.message += (" This broker of a pair began serving moments ago and its workers "
                          "are still registering: retry in a moment.")
        error.args = (error.message,)
        error.details["settling"] = True
        return error


def settling_refusal() -> HandshakeError:
    """The refusal of a client while the broker settles."""
    return HandshakeError("The broker cannot serve yet.", reason="settling")


def adopt_reports(registry: Any, worker: Worker, body: dict[str, Any], now: float) -> None:
    """Make RESUMABLE sessions of what a registering worker reports it kept (see the rule);
    a session id the broker already knows is left out."""
    owners = {owner: index for index, owner in enumerate(registry._owners)}
    adopted = 0
    for report in decode_reports(body.get("sessions"), len(worker.devices)):
        token = owners.get(report.owner)
        if token is None or report.session in registry.sessions:
            registry.counters["resume_reports_refused"] += 1
            continue
        global_index = registry.worker_table.global_index(worker, report.device)
        session = Session(
            id=report.session, client=b"", device=global_index, local=report.device,
            worker=worker.identity, lane=worker.lane(report.device),
            phase=SessionPhase.RESUMABLE, created=now, last_seen=now, hello_request=0,
            token=token, secret_digest=report.secret_digest)
        session.submits = report.submits
        registry._sessions.adopt(session, worker, now)
        adopted += 1
    if adopted:
        registry.counters["sessions_reported"] += adopted
        log.info("worker %s reported %d session(s) to resume", worker.name, adopted)


def on_resume(registry: Any, identity: bytes, message: Message, now: float) -> list[Send]:
    """A client's RESUME: the session taken up, or a typed refusal (see the rule)."""
    body = message.body
    token = token_index(body["token"], registry._client_tokens)
    if token is None:
        return registry._client_token_refused(identity, message.header, now)
    if registry._passive(now):
        return registry._reject(identity, message.header, refusal(registry.pair, "session"),
                                now)
    session = registry.sessions.get(message.session)
    if session is not None and session.phase is SessionPhase.OPEN and session.secret_digest:
        # Opened here, on a pair: its client's link broke before this broker saw it go.
        if not _shows_its_secret(session, token, body):
            return _wrong_secret(registry, identity, message, now)
        registry._sessions.keep_for_resume(session, now)  # (and taken up at once, below)
    if session is not None and session.phase is not SessionPhase.RESUMABLE:
        registry.counters["sessions_not_resumed"] += 1
        return registry._reject(identity, message.header, ResumeRefused(
            f"Session {message.session:#x} is not waiting to be resumed on this broker: it "
            "was opened or resumed here already. Open a new session.",
            session=message.session, reason="not_resumable"), now)
    if session is None:
        if registry.settling.unknown_may_come(now):
            return registry._refuse_settling(identity, message.header, now)
        registry.counters["sessions_not_resumed"] += 1
        return registry._reject(identity, message.header, ResumeRefused(
            f"Session {message.session:#x} cannot be resumed: no worker reported it to the "
            "broker that took over (its worker died too, or kept it past its --resume-grace)"
            ". Open a new session.", session=message.session, reason="not_reported"), now)
    if not _shows_its_secret(session, token, body):
        return _wrong_secret(registry, identity, message, now)
    if registry.worker_table.owner(session.device) is None:  # (its lanes not all attached)
        return registry._refuse_settling(identity, message.header, now)
    registry._sessions.resume(session, identity, now)
    session.client_max = size_limit(body, registry.limits.max_message_bytes)
    registry.counters["sessions_resumed"] += 1
    worker = registry.workers[session.worker]
    return [send_message(Side.FRONTEND, identity, Message(
        Kind.RESUMED, session.id, message.request,
        {"device": registry.device_of(session), "device_count": registry.device_count,
         "server": registry.server, "heartbeat": registry.limits.heartbeat,
         "max_message_bytes": min(registry.limits.max_message_bytes,
                                  worker.max_message_bytes),
         "submits": session.submits}))]


def _shows_its_secret(session: Session, token: int, body: dict[str, Any]) -> bool:
    """Whether a RESUME shows the session's client token and a secret of its digest."""
    return session.token == token and secret_matches(body["secret"], session.secret_digest)


def _wrong_secret(registry: Any, identity: bytes, message: Message, now: float) -> list[Send]:
    """A RESUME without the session's secret or token: refused, counted, answered late; the
    session stays its own client's."""
    registry.counters["resumes_refused"] += 1
    return registry._token_refused(registry._reject(identity, message.header, ResumeRefused(
        f"Session {message.session:#x} is not resumed: the secret or the client token "
        "is not the session's. Only the client that opened a session can resume it.",
        session=message.session, reason="wrong_secret"), now), now)
