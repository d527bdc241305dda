"""What workers send the broker, sans I/O: the ``Registry``'s part that registers a worker,
routes its data to clients (and tensors to other sessions' devices), and takes its answers
about sessions (opened, closed, refused, errors) and its heartbeats.

Rule: a worker is admitted here (token, release, name, lanes and beacon: the checks are in
``broker.handshake`` and ``broker.worker_table``), and its data is routed by the header alone,
as the client's is; a session's phase moves only as ``broker.sessions`` allows; a TRANSFER
goes on only from the worker that owns its source session, to an open session (its device
takes it only with a ticket its own client gave). A malformed message is answered and
counted; the worker and its sessions go on.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from fabric.core import protocol
from fabric.core.errors import AuthenticationError, ProtocolError
from fabric.core.flow import largest_frame
from fabric.core.protocol import PROTOCOL_VERSION, WORKER_DATA_KINDS, Header, Kind, Message
from fabric.core.resume import digest

from . import link_grants, resume
from .handshake import (misplaced, peer_address, release_mismatch, reported_host, size_limit,
                        token_ok, version_mismatch)
from .model import Send, Session, SessionPhase, Side, Worker, new_send, send_error, send_message
from .pair import refusal
from .sessions import SessionEvent
from .sizes import frames_size, transfer_too_large

log = logging.getLogger("fabric.broker")

_TAKES_TRANSFERS = frozenset({SessionPhase.OPEN, SessionPhase.RESUMABLE})


class WorkerMessages:
    """The ``Registry``'s handling of what workers send (a mixin over the registry's rooms:
    ``sessions``, ``workers``, ``worker_table``, ``_sessions``, ``_endings``, its counters
    and its answers)."""

    def from_worker(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """A message on the workers' socket (routing identity already split off)."""
        header = None  # once read, an error answer names the request it answers
        try:
            if not frames:
                raise ProtocolError("A message needs a header frame.")
            header = protocol.decode_header(frames[0])
            if len(frames) > 2 and self._oversized(frames):
                return self._too_large(Side.WORKERS, identity, header, frames, now)
            worker = self._find_worker(identity)
            if (worker is not None and identity in self._lane_owner
                    and identity not in worker.attached and header.kind == Kind.HEARTBEAT):
                self.worker_table.attach(worker, identity)
            if worker is not None:
                worker.last_seen = now
                if header.kind in WORKER_DATA_KINDS and header.version == PROTOCOL_VERSION:
                    protocol.check_frames(header, frames)
                    return self._route_worker_data(worker, header, frames)
            if header.kind == Kind.REGISTER:
                if header.version != PROTOCOL_VERSION:
                    self.rejects["worker_version_mismatch"] += 1
                    return [send_error(Side.WORKERS, identity,
                                       version_mismatch("worker", header.version),
                                       kind=Kind.REJECT)]
                return self._on_register(identity, protocol.decode(frames, header), now,
                                         peer_address(frames[0]))
            if worker is None:
                self.counters["unregistered_worker_messages"] += 1
                self._log_peer(logging.WARNING, "message from an unregistered worker",
                               identity, now)
                return [send_error(Side.WORKERS, identity, misplaced(  # (WrongPort to a client)
                    Side.WORKERS, header.kind, self.endpoints), session=header.session,
                    request=header.request)]
            message = protocol.decode(frames, header)
        except ProtocolError as exc:
            return self._bad_input(Side.WORKERS, identity, exc, now, header)
        if message.version != PROTOCOL_VERSION:  # its body was not validated
            return self._other_version(Side.WORKERS, identity, message, now)
        handler = self._worker_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.WORKERS, identity, ProtocolError(
                f"A {message.kind.name} message is not accepted from a worker."), now, header)
        return handler(self, worker, message, now)

    def _route_worker_data(self, worker: Worker, header: Header,
                           frames: Sequence[Any]) -> list[Send]:
        session = self.sessions.get(header.session)
        if header.kind == Kind.TRANSFER:
            # A tensor moving between sessions: the sender must own the source session (the
            # request field); the destination's device takes it only with a ticket it gave
            # its own client (``expect``), so knowing a session id is not enough.
            # After a takeover the destination may wait for its client's RESUME: its device
            # holds it, and the ticket still guards it.
            source = self.sessions.get(header.request)
            if (source is None or source.worker != worker.identity or session is None
                    or session.phase not in _TAKES_TRANSFERS):
                self.counters["refused_transfers"] += 1
                return []
            session.messages_in += 1  # (towards the destination device)
            session.bytes_in += frames_size(frames)
            destination = self.workers[session.worker]
            if largest_frame(frames) > destination.max_message_bytes:
                self.counters["transfers_too_large"] += 1
                return transfer_too_large(destination, session.lane, header, frames)
            return [new_send(Send, (Side.WORKERS, session.lane, list(frames), 0.0))]
        if session is None or session.worker != worker.identity or not session.client:
            # the session closed meanwhile (or, reported after a takeover, waits for its
            # client's RESUME)
            self.counters["stale_worker_data"] += 1
            return []
        session.messages_out += 1
        session.bytes_out += frames_size(frames)
        return [new_send(Send, (Side.FRONTEND, session.client, list(frames), 0.0))]

    def _on_register(self, identity: bytes, message: Message, now: float,
                     address: str) -> list[Send]:
        body = message.body
        if not token_ok(body["token"], self._worker_token):
            self.rejects["worker_unauthorized"] += 1
            self._log_peer(logging.WARNING, "refused a worker registration (bad worker token)",
                           identity, now)
            return self._token_refused([send_error(Side.WORKERS, identity, AuthenticationError(
                "The broker refused the worker token: start the worker with the cluster's "
                "worker token."), kind=Kind.REJECT)], now)
        if self._passive(now):
            self.rejects["broker_passive"] += 1
            return [send_error(Side.WORKERS, identity, refusal(self.pair, "registration"),
                               kind=Kind.REJECT, request=message.request)]
        if not all(isinstance(d, dict) for d in body["devices"]):
            return self._bad_input(Side.WORKERS, identity, ProtocolError(
                "REGISTER devices must be a list of maps."), now, message.header)
        instance = body.get("instance", b"")  # optional: a worker without one never matches
        instance = instance if isinstance(instance, bytes) and len(instance) <= 64 else b""
        refused = release_mismatch(body) or self.worker_table.name_held(
            identity, body["name"], instance, now, self.limits.heartbeat * self.limits.liveness)
        if refused is not None:  # another fabric release, or a live worker's name
            self.rejects[refused.code] += 1
            self._log_peer(logging.WARNING, f"refused a worker registration ({refused.code})",
                           identity, now)
            return [send_error(Side.WORKERS, identity, refused, kind=Kind.REJECT,
                               request=message.request)]
        lanes = body.get("lanes", [])
        beacon = body.get("beacon", b"")  # optional: a worker without one is lost only when
        # a send to it finds its connection closed
        refused = self.worker_table.lanes_refused(identity, body["name"], lanes,
                                                  len(body["devices"])) or (
            self.worker_table.beacon_refused(identity, body["name"], beacon, lanes)
            if beacon else None)
        if refused is not None:
            return self._bad_input(Side.WORKERS, identity, refused, now, message.header)
        sends: list[Send] = []
        for old in self.worker_table.replaced_by(identity, body["name"]):
            sends += self._endings.lose_worker(old, "the worker re-registered")
        self.worker_table.add(Worker(
            identity, body["name"], body["backend"], list(body["devices"]), registered=now,
            last_seen=now, max_message_bytes=size_limit(body, self.limits.max_message_bytes),
            lanes=list(lanes), beacon=beacon, instance=instance, host=reported_host(body),
            address=address, bulk=link_grants.reported_bulk(body)))
        log.info("worker %s registered with %d %s device(s)", body["name"],
                 len(body["devices"]), body["backend"])
        self.settling.registered(body["name"])
        if "sessions" in body:  # kept for a broker that takes over (``broker.resume``)
            resume.adopt_reports(self, self.workers[identity], body, now)
        sends.append(send_message(Side.WORKERS, identity, Message(
            Kind.REGISTERED, 0, message.request,
            {"server": self.server, "heartbeat": self.limits.heartbeat,
             "max_message_bytes": self.limits.max_message_bytes})))
        return sends

    def _worker_session(self, worker: Worker, message: Message) -> Session | None:
        session = self.sessions.get(message.session)
        return session if session is not None and session.worker == worker.identity else None

    def _on_opened(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None or not self._sessions.allows(session, SessionEvent.OPENED):
            return []  # the client went away or gave up meanwhile; the drop closed it
        self._sessions.move(session, SessionEvent.OPENED, now)
        secret = message.body.get("secret")
        if self.pair is not None and isinstance(secret, bytes):
            # (its digest only: the client may resume it here, its link lost, ``broker.resume``)
            session.secret_digest = digest(secret)
        return [send_message(Side.FRONTEND, session.client, Message(
            Kind.WELCOME, session.id, session.hello_request,
            {"device": self.device_of(session), "device_count": self.device_count,
             "server": self.server, "heartbeat": self.limits.heartbeat,
             "max_message_bytes": min(self.limits.max_message_bytes,
                                      worker.max_message_bytes),
             # its resume secret, passed on and not kept (``broker.resume``)
             **({"secret": message.body["secret"]} if "secret" in message.body else {})}))]

    def _on_closed(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None or not self._sessions.allows(session, SessionEvent.CLOSED):
            return []
        self._sessions.move(session, SessionEvent.CLOSED, now)
        return [self._endings.closed(session)]

    def _on_worker_error(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None:
            log.warning("worker %s reported: %s", worker.name, message.body.get("message"))
            return []
        if self._sessions.allows(session, SessionEvent.REFUSED):  # it would not open it
            self._sessions.move(session, SessionEvent.REFUSED, now)
            self.rejects[str(message.body["code"])] += 1
            return [send_message(Side.FRONTEND, session.client, Message(
                Kind.REJECT, session.id, session.hello_request, message.body))]
        session.errors += 1
        return [send_message(Side.FRONTEND, session.client, Message(
            Kind.ERROR, session.id, message.request, message.body))]

    def _on_heartbeat(self, worker: Worker, message: Message, now: float) -> list[Send]:
        try:  # (last_seen is updated already) what the devices did, if said (lanes do not)
            report = protocol.decode_report(message.body, len(worker.devices))
        except ProtocolError as exc:  # counted; the worker and its sessions go on
            return self._bad_input(Side.WORKERS, worker.identity, exc, now, message.header)
        worker.report = report or worker.report
        return []

    _worker_handlers = {
        Kind.OPENED: _on_opened,
        Kind.CLOSED: _on_closed,
        Kind.ERROR: _on_worker_error,
        Kind.REJECT: _on_worker_error,
        Kind.HEARTBEAT: _on_heartbeat,
        Kind.PONG: _on_heartbeat,
        Kind.LINK: link_grants.grant,
    }
