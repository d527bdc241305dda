"""The broker's session registry and worker table, sans I/O.

Rule: every rule about sessions and workers lives here: who may open a session, which worker
serves it, what happens when a peer vanishes or a deadline passes. The I/O loop
(``broker.server``) feeds this object frames, "unroutable" events and the clock, and sends
the ``Send`` items it returns; nothing here touches a socket or reads the clock.

Checks on HELLO, in order and before any state is created: protocol version, client token
(constant-time), device index, duplicate session id. Data messages are routed by the header
alone: their body and buffers are handed on as the frame objects that arrived.
"""

from __future__ import annotations

import enum
import hmac
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

from fabric import protocol
from fabric.errors import (
    AuthenticationError,
    DeviceOffline,
    DuplicateSession,
    FabricError,
    HandshakeError,
    NoSuchDevice,
    ProtocolError,
    SessionLost,
    VersionMismatch,
)
from fabric.protocol import DATA_KINDS, PROTOCOL_VERSION, Header, Kind, Message

log = logging.getLogger("fabric.broker")


class Side(enum.Enum):
    FRONTEND = "frontend"  # clients and admin
    BACKEND = "backend"  # workers


class Send(NamedTuple):
    """One message for the I/O loop to send: to which socket, which peer, which frames."""

    side: Side
    identity: bytes
    frames: list[Any]


class SessionState(enum.Enum):
    OPENING = "opening"  # HELLO accepted, waiting for the worker's OPENED
    OPEN = "open"
    CLOSING = "closing"  # CLOSE forwarded, waiting for the worker's CLOSED


@dataclass
class Session:
    id: int
    client: bytes
    device: int  # global index
    local: int  # index on its worker
    worker: bytes
    state: SessionState
    created: float
    last_seen: float
    hello_request: int
    deadline: float = float("inf")  # for OPENING and CLOSING
    probed: float = 0.0  # when the broker last checked an idle client was still there
    messages: int = 0
    bytes: int = 0


@dataclass
class Worker:
    identity: bytes
    name: str
    backend: str
    devices: list[dict[str, Any]]
    registered: float
    last_seen: float
    sessions: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Limits:
    """Timing rules; the defaults suit a LAN, tests shorten them."""

    heartbeat: float = 1.0  # seconds between heartbeats to workers
    liveness: int = 3  # heartbeats missed before a worker is declared lost
    open_timeout: float = 5.0  # how long a worker may take to open a session
    lease: float = 10.0  # idle time after which the broker checks a client is still there


MAX_REMEMBERED_WORKERS = 1024  # offline workers whose device indexes are kept for them


def _natural(name: str) -> list[Any]:
    """Sort key that orders worker-2 before worker-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name)]


def _frames_size(frames: Sequence[Any]) -> int:
    return sum(len(f) for f in frames)


class Registry:
    """Sessions, workers and devices of one broker, driven by events and the clock."""

    def __init__(
        self,
        *,
        client_token: str,
        worker_token: str,
        admin_token: str | None = None,
        server: str = "fabric-broker",
        limits: Limits = Limits(),
        now: float = 0.0,
    ) -> None:
        self._client_token = client_token.encode()
        self._worker_token = worker_token.encode()
        self._admin_token = admin_token.encode() if admin_token else None
        self.server = server
        self.limits = limits
        self.started = now
        self.sessions: dict[int, Session] = {}
        self.workers: dict[bytes, Worker] = {}
        self.devices: list[dict[str, Any]] = []  # the online devices, by global index
        self._device_info: dict[int, dict[str, Any]] = {}  # global index -> description
        self._device_owner: dict[int, tuple[bytes, int]] = {}  # global index -> (worker, local)
        self._known: dict[str, int] = {}  # every worker name seen -> its device count
        self.device_count = 0  # global indexes in use, online or not
        self._next_heartbeat = now
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _message(side: Side, identity: bytes, message: Message) -> Send:
        return Send(side, identity, protocol.encode(message))

    def _error(self, side: Side, identity: bytes, error: FabricError, *, kind: Kind = Kind.ERROR,
               session: int = 0, request: int = 0) -> Send:
        return self._message(side, identity, protocol.error_message(
            error, kind=kind, session=session, request=request))

    def _reject(self, identity: bytes, header: Header, error: FabricError) -> list[Send]:
        self.rejects[error.code] += 1
        log.info("rejected handshake from %s: %s", identity.hex(), error.code)
        return [self._error(Side.FRONTEND, identity, error, kind=Kind.REJECT,
                            session=header.session, request=header.request)]

    def _token_ok(self, offered: Any, expected: bytes | None) -> bool:
        if expected is None or not isinstance(offered, str):
            return False
        return hmac.compare_digest(offered.encode(), expected)

    def _bad_input(self, side: Side, identity: bytes, error: ProtocolError,
                   header: Header | None = None) -> list[Send]:
        self.counters[f"{side.value}_protocol_errors"] += 1
        log.warning("bad message on the %s from %s: %s", side.value, identity.hex(), error)
        session, request = (header.session, header.request) if header else (0, 0)
        return [self._error(side, identity, error, session=session, request=request)]

    def _rebuild_devices(self) -> None:
        # Devices are numbered by worker name (naturally sorted: worker-2 before worker-10),
        # then local index, over every worker seen so far: a lost worker keeps its indexes,
        # so no other device moves, and it gets them back when it registers again.
        while len(self._known) > MAX_REMEMBERED_WORKERS:  # forget the oldest offline one
            online = {w.name for w in self.workers.values()}
            oldest = next((name for name in self._known if name not in online), None)
            if oldest is None:
                break
            del self._known[oldest]
        online = {w.name: w for w in self.workers.values()}
        self.devices, self._device_info, self._device_owner = [], {}, {}
        index = 0
        for name in sorted(self._known, key=_natural):
            worker = online.get(name)
            for local in range(self._known[name]):
                if worker is not None:
                    info = {"index": index, "worker": name, "local": local,
                            "backend": worker.backend, "settings": worker.devices[local]}
                    self.devices.append(info)
                    self._device_info[index] = info
                    self._device_owner[index] = (worker.identity, local)
                index += 1
        self.device_count = index
        for session in self.sessions.values():  # a new name may sort before theirs
            worker = self.workers[session.worker]
            session.device = next(i for i, owner in self._device_owner.items()
                                  if owner == (worker.identity, session.local))

    def device_of(self, session: Session) -> dict[str, Any]:
        return self._device_info[session.device]

    # -- clients -----------------------------------------------------------------------

    def from_client(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """A message from the frontend (routing identity already split off)."""
        header = None  # once read, an error answer names the request it answers
        try:
            if len(frames) < 2:
                raise ProtocolError("A message needs a header frame and a body frame.")
            header = protocol.decode_header(frames[0])
            if header.kind in DATA_KINDS:
                return self._route_client_data(identity, header, frames, now)
            if header.kind == Kind.HELLO and header.version != PROTOCOL_VERSION:
                # Checked before the body: another version may lay out its body differently.
                return self._reject(identity, header, VersionMismatch(
                    f"The client speaks protocol version {header.version} and this broker "
                    f"speaks {PROTOCOL_VERSION}: install matching fabric versions.",
                    client_version=header.version, server_version=PROTOCOL_VERSION))
            message = protocol.decode(frames)
        except ProtocolError as exc:
            return self._bad_input(Side.FRONTEND, identity, exc, header)
        handler = self._client_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.FRONTEND, identity, ProtocolError(
                f"A {message.kind.name} message is not accepted from a client."), header)
        if message.version != PROTOCOL_VERSION:
            return self._bad_input(Side.FRONTEND, identity, ProtocolError(
                f"Protocol version {message.version} is not {PROTOCOL_VERSION}: "
                "install matching fabric versions.", client_version=message.version,
                server_version=PROTOCOL_VERSION), header)
        return handler(self, identity, message, now)

    def _route_client_data(self, identity: bytes, header: Header, frames: Sequence[Any],
                           now: float) -> list[Send]:
        session = self.sessions.get(header.session)
        if session is None or session.client != identity or session.state != SessionState.OPEN:
            self.counters["unknown_session"] += 1
            return [self._error(Side.FRONTEND, identity, SessionLost(
                f"Session {header.session:#x} is not open on this broker: open a new session.",
                session=header.session), session=header.session, request=header.request)]
        session.last_seen = now
        session.messages += 1
        session.bytes += _frames_size(frames)
        return [Send(Side.BACKEND, session.worker, list(frames))]

    def _on_hello(self, identity: bytes, message: Message, now: float) -> list[Send]:
        header = message.header
        body = message.body
        if not self._token_ok(body["token"], self._client_token):
            return self._reject(identity, header, AuthenticationError(
                "The broker refused the token: check the client token you were given."))
        device = body["device"]
        if not 0 <= device < self.device_count:
            return self._reject(identity, header, NoSuchDevice(
                f"Device {device} does not exist: this cluster has {self.device_count} "
                f"device(s), numbered from 0; list them with fabric.devices().",
                device=device, device_count=self.device_count))
        if device not in self._device_owner:
            return self._reject(identity, header, DeviceOffline(
                f"Device {device} is offline: its worker is not connected. Retry when it "
                "is back, or choose another device from fabric.devices().", device=device))
        if message.session == 0 or message.session in self.sessions:
            return self._reject(identity, header, DuplicateSession(
                f"Session id {message.session:#x} is already in use (or zero): "
                "let the client choose a fresh random id.", session=message.session))
        worker, local = self._device_owner[device]
        self.sessions[message.session] = Session(
            id=message.session, client=identity, device=device, local=local, worker=worker,
            state=SessionState.OPENING, created=now, last_seen=now,
            hello_request=message.request, deadline=now + self.limits.open_timeout)
        self.workers[worker].sessions.add(message.session)
        self.counters["hellos"] += 1
        return [self._message(Side.BACKEND, worker, Message(
            Kind.OPEN, message.session, message.request,
            {"device": local, "client": str(body.get("client", ""))}))]

    def _on_devices(self, identity: bytes, message: Message, now: float) -> list[Send]:
        if not self._token_ok(message.body["token"], self._client_token):
            return self._reject(identity, message.header, AuthenticationError(
                "The broker refused the token: check the client token you were given."))
        return [self._message(Side.FRONTEND, identity, Message(
            Kind.DEVICE_LIST, 0, message.request,
            {"devices": self.devices, "server": self.server}))]

    def _on_close(self, identity: bytes, message: Message, now: float) -> list[Send]:
        session = self.sessions.get(message.session)
        if session is None or session.client != identity:
            return [self._error(Side.FRONTEND, identity, SessionLost(
                f"Session {message.session:#x} is not open on this broker.",
                session=message.session), session=message.session, request=message.request)]
        session.last_seen = now
        if session.state == SessionState.OPENING:
            # The client gave up on the handshake; the worker may still open it, so close
            # there too and answer at once.
            return self._drop_session(session, notify_worker=True) + [self._message(
                Side.FRONTEND, identity, Message(Kind.CLOSED, session.id, message.request))]
        session.state = SessionState.CLOSING
        session.hello_request = message.request  # the CLOSED answers this request
        session.deadline = now + self.limits.open_timeout
        return [self._message(Side.BACKEND, session.worker, Message(
            Kind.CLOSE, session.id, message.request))]

    def _on_ping(self, identity: bytes, message: Message, now: float) -> list[Send]:
        for session in self.sessions.values():
            if session.client == identity:
                session.last_seen = now
        return [self._message(Side.FRONTEND, identity, Message(
            Kind.PONG, message.session, message.request))]

    _client_handlers = {
        Kind.HELLO: _on_hello,
        Kind.DEVICES: _on_devices,
        Kind.CLOSE: _on_close,
        Kind.PING: _on_ping,
    }

    # -- workers -----------------------------------------------------------------------

    def from_worker(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """A message from the backend (routing identity already split off)."""
        header = None  # once read, an error answer names the request it answers
        try:
            if len(frames) < 2:
                raise ProtocolError("A message needs a header frame and a body frame.")
            header = protocol.decode_header(frames[0])
            worker = self.workers.get(identity)
            if worker is not None:
                worker.last_seen = now
                if header.kind in DATA_KINDS:
                    return self._route_worker_data(worker, header, frames)
            if header.kind == Kind.REGISTER:
                if header.version != PROTOCOL_VERSION:
                    self.rejects["worker_version_mismatch"] += 1
                    return [self._error(Side.BACKEND, identity, VersionMismatch(
                        f"The worker speaks protocol version {header.version} and this broker "
                        f"speaks {PROTOCOL_VERSION}: install matching fabric versions.",
                        client_version=header.version, server_version=PROTOCOL_VERSION),
                        kind=Kind.REJECT)]
                return self._on_register(identity, protocol.decode(frames), now)
            if worker is None:
                self.counters["unregistered_worker_messages"] += 1
                log.warning("message from unregistered worker %s", identity.hex())
                return [self._error(Side.BACKEND, identity, ProtocolError(
                    "This worker is not registered: send REGISTER first.",
                    reason="not_registered"), session=header.session, request=header.request)]
            message = protocol.decode(frames)
        except ProtocolError as exc:
            return self._bad_input(Side.BACKEND, identity, exc, header)
        handler = self._worker_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                f"A {message.kind.name} message is not accepted from a worker."), header)
        if message.version != PROTOCOL_VERSION:  # its body was not validated
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                f"Protocol version {message.version} is not {PROTOCOL_VERSION}: "
                "install matching fabric versions.", worker_version=message.version,
                server_version=PROTOCOL_VERSION), header)
        return handler(self, worker, message, now)

    def _route_worker_data(self, worker: Worker, header: Header,
                           frames: Sequence[Any]) -> list[Send]:
        session = self.sessions.get(header.session)
        if session is None or session.worker != worker.identity:
            self.counters["stale_worker_data"] += 1  # the session closed meanwhile
            return []
        session.messages += 1
        session.bytes += _frames_size(frames)
        return [Send(Side.FRONTEND, session.client, list(frames))]

    def _on_register(self, identity: bytes, message: Message, now: float) -> list[Send]:
        body = message.body
        if not self._token_ok(body["token"], self._worker_token):
            self.rejects["worker_unauthorized"] += 1
            log.warning("refused a worker registration from %s: bad worker token",
                        identity.hex())
            return [self._error(Side.BACKEND, identity, AuthenticationError(
                "The broker refused the worker token: start the worker with the cluster's "
                "worker token."), kind=Kind.REJECT)]
        if not all(isinstance(d, dict) for d in body["devices"]):
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                "REGISTER devices must be a list of maps."), message.header)
        sends: list[Send] = []
        for old in [w for w in self.workers.values()
                    if w.name == body["name"] or w.identity == identity]:
            # A worker that restarted, or reconnected, replaces its earlier self.
            sends += self._lose_worker(old, "the worker re-registered")
        self.workers[identity] = Worker(identity, body["name"], body["backend"],
                                        list(body["devices"]), registered=now, last_seen=now)
        self._known.pop(body["name"], None)  # re-inserted last: the newest is forgotten last
        self._known[body["name"]] = len(body["devices"])
        self._rebuild_devices()
        log.info("worker %s registered with %d %s device(s)", body["name"],
                 len(body["devices"]), body["backend"])
        sends.append(self._message(Side.BACKEND, identity, Message(
            Kind.REGISTERED, 0, message.request,
            {"server": self.server, "heartbeat": self.limits.heartbeat})))
        return sends

    def _worker_session(self, worker: Worker, message: Message) -> Session | None:
        session = self.sessions.get(message.session)
        return session if session is not None and session.worker == worker.identity else None

    def _on_opened(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None or session.state != SessionState.OPENING:
            return []  # the client went away or gave up meanwhile; the drop closed it
        session.state = SessionState.OPEN
        session.deadline = float("inf")
        return [self._message(Side.FRONTEND, session.client, Message(
            Kind.WELCOME, session.id, session.hello_request,
            {"device": self.device_of(session), "device_count": self.device_count,
             "server": self.server, "heartbeat": self.limits.heartbeat}))]

    def _on_closed(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None or session.state != SessionState.CLOSING:
            return []
        self._forget(session)
        return [self._message(Side.FRONTEND, session.client, Message(
            Kind.CLOSED, session.id, session.hello_request))]

    def _on_worker_error(self, worker: Worker, message: Message, now: float) -> list[Send]:
        session = self._worker_session(worker, message)
        if session is None:
            log.warning("worker %s reported: %s", worker.name, message.body.get("message"))
            return []
        if session.state == SessionState.OPENING:  # the worker refused to open it
            self._forget(session)
            self.rejects[str(message.body["code"])] += 1
            return [self._message(Side.FRONTEND, session.client, Message(
                Kind.REJECT, session.id, session.hello_request, message.body))]
        return [self._message(Side.FRONTEND, session.client, Message(
            Kind.ERROR, session.id, message.request, message.body))]

    def _on_heartbeat(self, worker: Worker, message: Message, now: float) -> list[Send]:
        return []  # last_seen was already updated: any traffic counts

    _worker_handlers = {
        Kind.OPENED: _on_opened,
        Kind.CLOSED: _on_closed,
        Kind.ERROR: _on_worker_error,
        Kind.REJECT: _on_worker_error,
        Kind.HEARTBEAT: _on_heartbeat,
        Kind.PONG: _on_heartbeat,
    }

    # -- peers that vanish, deadlines, heartbeats -----------------------------------------

    def _forget(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        worker = self.workers.get(session.worker)
        if worker is not None:
            worker.sessions.discard(session.id)

    def _drop_session(self, session: Session, *, notify_worker: bool) -> list[Send]:
        self._forget(session)
        if notify_worker and session.worker in self.workers:
            return [self._message(Side.BACKEND, session.worker,
                                  Message(Kind.CLOSE, session.id, 0))]
        return []

    def _lose_worker(self, worker: Worker, why: str) -> list[Send]:
        """Forget a worker and tell every client with a session on it."""
        log.warning("worker %s lost: %s", worker.name, why)
        self.counters["workers_lost"] += 1
        sends: list[Send] = []
        for session_id in sorted(worker.sessions):
            session = self.sessions.pop(session_id)
            device = self.device_of(session)["index"]
            if session.state == SessionState.OPENING:
                self.rejects["worker_lost"] += 1
                error: FabricError = HandshakeError(
                    f"Worker {worker.name} owning device {device} was lost while the session "
                    f"was opening ({why}): retry, or choose another device.",
                    device=device, worker=worker.name, reason="worker_lost")
                sends.append(self._error(Side.FRONTEND, session.client, error, kind=Kind.REJECT,
                                         session=session.id, request=session.hello_request))
            elif session.state == SessionState.CLOSING:
                sends.append(self._message(Side.FRONTEND, session.client, Message(
                    Kind.CLOSED, session.id, session.hello_request)))
            else:
                sends.append(self._error(Side.FRONTEND, session.client, SessionLost(
                    f"Session {session.id:#x} on device {device} is lost: worker "
                    f"{worker.name} {why}. Open a new session.",
                    device=device, worker=worker.name, session=session.id),
                    session=session.id))
        del self.workers[worker.identity]
        self._rebuild_devices()
        return sends

    def _lose_client(self, identity: bytes, why: str) -> list[Send]:
        sends: list[Send] = []
        for session in [s for s in self.sessions.values() if s.client == identity]:
            log.info("session %#x dropped: %s", session.id, why)
            self.counters["sessions_expired"] += 1
            sends += self._drop_session(session, notify_worker=True)
        return sends

    def unroutable(self, side: Side, identity: bytes, now: float) -> list[Send]:
        """The I/O loop could not deliver to this peer: it has disconnected."""
        if side == Side.BACKEND:
            worker = self.workers.get(identity)
            return self._lose_worker(worker, "disconnected") if worker else []
        return self._lose_client(identity, "the client disconnected")

    def next_deadline(self) -> float:
        """When ``tick`` next has work to do."""
        return self._next_heartbeat

    def tick(self, now: float) -> list[Send]:
        """Heartbeats, lost workers, handshake and close deadlines, idle-client probes."""
        sends: list[Send] = []
        limits = self.limits
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + limits.heartbeat
            heartbeat = protocol.encode(Message(Kind.HEARTBEAT))
            sends += [Send(Side.BACKEND, w, list(heartbeat)) for w in self.workers]
        for worker in list(self.workers.values()):
            if now - worker.last_seen > limits.heartbeat * limits.liveness:
                sends += self._lose_worker(
                    worker, f"sent nothing for {now - worker.last_seen:.1f} s")
        for session in list(self.sessions.values()):
            if now > session.deadline:
                if session.state == SessionState.OPENING:
                    self.rejects["open_timeout"] += 1
                    sends += self._drop_session(session, notify_worker=True)
                    sends.append(self._error(Side.FRONTEND, session.client, HandshakeError(
                        f"The worker did not open the session within "
                        f"{limits.open_timeout:g} s: retry, or choose another device.",
                        reason="open_timeout"),
                        kind=Kind.REJECT, session=session.id, request=session.hello_request))
                else:  # CLOSING: the worker is slow; the client's close succeeds anyway
                    self._forget(session)
                    sends.append(self._message(Side.FRONTEND, session.client, Message(
                        Kind.CLOSED, session.id, session.hello_request)))
            elif (now - session.last_seen > limits.lease
                  and now - session.probed > limits.lease):
                # An unroutable PING tells the loop the client has gone (ROUTER_MANDATORY).
                session.probed = now
                sends.append(self._message(Side.FRONTEND, session.client,
                                           Message(Kind.PING, session.id)))
        return sends

    def shutdown(self) -> list[Send]:
        """Tell every client its session ends because the broker stops."""
        sends = []
        for session in self.sessions.values():
            sends.append(self._error(Side.FRONTEND, session.client, SessionLost(
                "The broker is shutting down: open a new session when it is back.",
                session=session.id), session=session.id))
        return sends

    def status(self, now: float) -> dict[str, Any]:
        """A summary for logs and, later, the admin CLI."""
        return {
            "server": self.server, "uptime": now - self.started,
            "workers": len(self.workers), "devices": len(self.devices),
            "sessions": len(self.sessions), "rejects": dict(self.rejects),
            "counters": dict(self.counters),
        }
