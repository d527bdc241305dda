"""The broker's session registry and worker table, sans I/O.

Rule: every rule about sessions and workers lives here: who may open a session, which worker
serves it, what happens when a peer vanishes or a deadline passes. The I/O loop
(``broker.server``) feeds this object frames, "unroutable" events and the clock, and sends
the ``Send`` items it returns; nothing here touches a socket or reads the clock.

Checks on HELLO, in order and before any state is created: protocol version, client token
(constant-time), device index, device online, worker not draining, duplicate session id, and
the session limits (per client connection, per device). Data messages are routed by the
header alone: their body and buffers are handed on as the frame objects that arrived.

Message sizes: each peer says the largest frame its socket takes (``max_message_bytes`` in
HELLO and REGISTER); the broker tells each side what it may send towards the other (WELCOME
for uploads, OPEN for replies, REGISTERED for transfers), so that an oversized array is
refused with ``MessageTooLarge`` by its sender instead of a silent disconnect (see
``fabric.flow``). Every heartbeat to a worker lists the sessions the broker holds on it, and
the worker closes any other: a lost CLOSE cannot leak a session's memory.

Lanes: a worker may give each device its own socket (its "lane", a routing identity listed
in REGISTER), so that a device's traffic skips the worker's control thread. A session's
messages then go to its device's lane; the worker's own socket keeps registration and
heartbeats. A lane is routable once it has said HEARTBEAT (sent after REGISTERED), so a
worker's devices come online only when all its lanes have; each heartbeat to a lane lists
that device's sessions (on the lane, it cannot overtake an OPEN).

Traffic is counted per session on the hot path (messages, bytes, SUBMITs as op batches) and
folded into per-device totals when a session ends, so per-device and per-worker figures cost
nothing per message. ADMIN requests are answered here, after a constant-time check of the
admin token; the commands themselves live in ``broker.admin``. A refused token (client, admin
or worker) is counted and its answer carries a not-before time ``Limits.auth_delay`` ahead:
the I/O loop holds it, so this object never sleeps and the loop never blocks.
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
    DeviceDraining,
    DeviceOffline,
    DuplicateSession,
    FabricError,
    HandshakeError,
    MessageTooLarge,
    NoSuchDevice,
    NotFound,
    ProtocolError,
    SessionLost,
    TooManySessions,
    VersionMismatch,
)
from fabric.flow import (
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_MAX_SESSIONS_PER_DEVICE,
    DEFAULT_PEER_QUEUE,
    largest_frame,
    size_text,
)
from fabric.protocol import (
    CLIENT_DATA_KINDS,
    PROTOCOL_VERSION,
    WORKER_DATA_KINDS,
    Header,
    Kind,
    Message,
)

log = logging.getLogger("fabric.broker")


class Side(str, enum.Enum):  # (a str: hashed in C; a plain Enum's __hash__ is Python code)
    FRONTEND = "frontend"  # clients and admin
    BACKEND = "backend"  # workers


class Send(NamedTuple):
    """One message for the I/O loop to send: to which socket, which peer, which frames, and
    not before when (the answer to a refused token waits ``Limits.auth_delay``; 0 is now)."""

    side: Side
    identity: bytes
    frames: list[Any]
    not_before: float = 0.0


# Data messages are forwarded as ``_new(Send, (side, identity, frames, 0.0))``: the named
# tuple's own ``__new__`` is a Python call, on every message (see ``fabric.protocol``).
_new = tuple.__new__


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
    lane: bytes  # where its messages go: the device's own socket, or the worker's
    state: SessionState
    created: float
    last_seen: float
    hello_request: int
    deadline: float = float("inf")  # for OPENING and CLOSING
    client_max: int = DEFAULT_MAX_MESSAGE_BYTES  # the largest frame the client's socket takes
    probed: float = 0.0  # when the broker last checked an idle client was still there
    messages: int = 0  # data messages both ways
    bytes: int = 0
    submits: int = 0  # SUBMIT messages: batches of ops (bodies are never decoded here)
    errors: int = 0  # ERROR messages from the worker about this session


@dataclass
class Worker:
    identity: bytes
    name: str
    backend: str
    devices: list[dict[str, Any]]
    registered: float
    last_seen: float
    sessions: set[int] = field(default_factory=set)
    draining: bool = False  # set by an administrator: no new sessions, existing ones go on
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # the largest frame it takes
    lanes: list[bytes] = field(default_factory=list)  # each device's own socket, if any
    attached: set[bytes] = field(default_factory=set)  # lanes heard from since REGISTER

    @property
    def ready(self) -> bool:
        """Whether every lane has been heard from, so that messages to it are routable."""
        return len(self.attached) == len(self.lanes)

    def lane(self, local: int) -> bytes:
        """Where messages for device ``local`` go: its lane, else the worker's socket."""
        return self.lanes[local] if self.lanes else self.identity


@dataclass
class Traffic:
    """Totals of the sessions that have ended on one device (by worker name, local index)."""

    sessions: int = 0
    messages: int = 0
    bytes: int = 0
    submits: int = 0
    errors: int = 0

    def add(self, session: Session | Traffic) -> None:
        """Fold a session's (or another total's) counts into this one."""
        self.messages += session.messages
        self.bytes += session.bytes
        self.submits += session.submits
        self.errors += session.errors
        self.sessions += session.sessions if isinstance(session, Traffic) else 1


@dataclass(frozen=True)
class Limits:
    """Timing rules and resource limits; the defaults suit a LAN, tests shorten them."""

    heartbeat: float = 1.0  # seconds between heartbeats to workers
    liveness: int = 3  # heartbeats missed before a worker is declared lost
    open_timeout: float = 5.0  # how long a worker may take to open a session
    lease: float = 10.0  # idle time after which the broker checks a client is still there
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # MAXMSGSIZE of both sockets
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT  # per client connection
    max_sessions_per_device: int = DEFAULT_MAX_SESSIONS_PER_DEVICE
    hwm: int = DEFAULT_HWM  # SNDHWM and RCVHWM of both sockets, per peer
    peer_queue: int = DEFAULT_PEER_QUEUE  # messages parked for a peer whose queue is full
    # How long a worker's parked queue may stay full (the frontend unread meanwhile) before
    # it is lost; None: 2/3 of heartbeat x liveness, under the clients' heartbeat timeout
    # (fabric.flow), which would drop the connections of clients whose sends wait meanwhile.
    slow_peer_timeout: float | None = None

    @property
    def slow_worker_timeout(self) -> float:
        """``slow_peer_timeout``, or its default from the heartbeat."""
        if self.slow_peer_timeout is not None:
            return self.slow_peer_timeout
        return self.heartbeat * self.liveness * 2 / 3
    auth_delay: float = 0.2  # a refused token is answered this much later (the loop holds it)


MAX_REMEMBERED_WORKERS = 1024  # offline workers whose device indexes are kept for them


def _natural(name: str) -> list[Any]:
    """Sort key that orders worker-2 before worker-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name)]


def _frames_size(frames: Sequence[Any]) -> int:
    return sum(map(len, frames))


def _size_limit(body: dict[str, Any], default: int) -> int:
    """A peer's ``max_message_bytes`` (optional in HELLO and REGISTER), capped by ours."""
    value = body.get("max_message_bytes")
    if type(value) is int and value > 0:
        return min(value, default)
    return default


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
        self._lane_owner: dict[bytes, bytes] = {}  # lane identity -> its worker's identity
        self.devices: list[dict[str, Any]] = []  # the online devices, by global index
        self._device_info: dict[int, dict[str, Any]] = {}  # global index -> description
        self._device_owner: dict[int, tuple[bytes, int]] = {}  # global index -> (worker, local)
        self._known: dict[str, int] = {}  # every worker name seen -> its device count
        self.device_count = 0  # global indexes in use, online or not
        self.device_slots: list[tuple[str, int]] = []  # global index -> (worker name, local)
        self._next_heartbeat = now
        self._next_scan = now
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()
        self.retired: dict[tuple[str, int], Traffic] = {}  # (worker name, local) -> totals
        self.stopping = False  # set by the admin ``shutdown``: the I/O loop stops
        self.client_sessions: dict[bytes, set[int]] = {}  # client identity -> its sessions
        self._device_sessions: Counter[tuple[bytes, int]] = Counter()  # (worker, local)
        self.queues: dict[str, Any] = {}  # flow figures the I/O loop keeps (admin status)

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

    def _token_refused(self, sends: list[Send], now: float) -> list[Send]:
        """The answer to a refused token, held back ``auth_delay`` by the I/O loop (it never
        sleeps here) so guessing costs time; counted with the reason already recorded."""
        self.counters["tokens_refused"] += 1
        return [send._replace(not_before=now + self.limits.auth_delay) for send in sends]

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
            for key in [k for k in self.retired if k[0] == oldest]:
                del self.retired[key]
        online = {w.name: w for w in self.workers.values() if w.ready}
        self.devices, self._device_info, self._device_owner = [], {}, {}
        self.device_slots = []
        index = 0
        for name in sorted(self._known, key=_natural):
            worker = online.get(name)
            for local in range(self._known[name]):
                self.device_slots.append((name, local))
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
            if not frames:
                raise ProtocolError("A message needs a header frame.")
            header = protocol.decode_header(frames[0])
            if header.kind in CLIENT_DATA_KINDS and header.version == PROTOCOL_VERSION:
                protocol.check_frames(header, frames)
                return self._route_client_data(identity, header, frames, now)
            if header.kind == Kind.HELLO and header.version != PROTOCOL_VERSION:
                # Checked before the body: another version may lay out its body differently.
                return self._reject(identity, header, VersionMismatch(
                    f"The client speaks protocol version {header.version} and this broker "
                    f"speaks {PROTOCOL_VERSION}: install matching fabric versions.",
                    client_version=header.version, server_version=PROTOCOL_VERSION))
            message = protocol.decode(frames, header)
        except ProtocolError as exc:
            return self._bad_input(Side.FRONTEND, identity, exc, header)
        if message.version != PROTOCOL_VERSION:
            return self._bad_input(Side.FRONTEND, identity, ProtocolError(
                f"Protocol version {message.version} is not {PROTOCOL_VERSION}: "
                "install matching fabric versions.", client_version=message.version,
                server_version=PROTOCOL_VERSION), header)
        handler = self._client_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.FRONTEND, identity, ProtocolError(
                f"A {message.kind.name} message is not accepted from a client."), header)
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
        if header.kind is Kind.SUBMIT:  # enum members are singletons: the cheapest test
            session.submits += 1
        return [_new(Send, (Side.BACKEND, session.lane, list(frames), 0.0))]

    def _on_hello(self, identity: bytes, message: Message, now: float) -> list[Send]:
        header = message.header
        body = message.body
        if not self._token_ok(body["token"], self._client_token):
            return self._token_refused(self._reject(identity, header, AuthenticationError(
                "The broker refused the token: check the client token you were given.")), now)
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
        worker, local = self._device_owner[device]
        if self.workers[worker].draining:
            name = self.workers[worker].name
            return self._reject(identity, header, DeviceDraining(
                f"Device {device} is draining: an administrator stopped its worker {name} "
                "from taking new sessions. Choose another device from fabric.devices().",
                device=device, worker=name))
        if message.session == 0 or message.session in self.sessions:
            return self._reject(identity, header, DuplicateSession(
                f"Session id {message.session:#x} is already in use (or zero): "
                "let the client choose a fresh random id.", session=message.session))
        refused = self._session_limit(identity, device, worker, local)
        if refused is not None:
            return self._reject(identity, header, refused)
        session = self.sessions[message.session] = Session(
            id=message.session, client=identity, device=device, local=local, worker=worker,
            lane=self.workers[worker].lane(local), state=SessionState.OPENING, created=now,
            last_seen=now, hello_request=message.request, deadline=now + self.limits.open_timeout,
            client_max=_size_limit(body, self.limits.max_message_bytes))
        self.workers[worker].sessions.add(message.session)
        self.client_sessions.setdefault(identity, set()).add(message.session)
        self._device_sessions[worker, local] += 1
        self.counters["hellos"] += 1
        return [self._message(Side.BACKEND, session.lane, Message(
            Kind.OPEN, message.session, message.request,
            {"device": local, "client": str(body.get("client", "")),
             "max_message_bytes": session.client_max}))]

    def _session_limit(self, identity: bytes, device: int, worker: bytes,
                       local: int) -> TooManySessions | None:
        """The refusal when a new session would pass a session limit, else None."""
        limits = self.limits
        held = len(self.client_sessions.get(identity, ()))
        if held >= limits.max_sessions_per_client:
            return TooManySessions(
                f"This client connection already has {held} sessions on this broker, the "
                f"most it allows (--max-sessions-per-client {limits.max_sessions_per_client})"
                ": close the sessions you no longer need, or ask the operator to raise the "
                "limit.", reason="per_client", limit=limits.max_sessions_per_client)
        held = self._device_sessions[worker, local]
        if held >= limits.max_sessions_per_device:
            return TooManySessions(
                f"Device {device} already serves {held} sessions, the most it allows "
                f"(--max-sessions-per-device {limits.max_sessions_per_device}): close idle "
                "sessions, choose another device from fabric.devices(), or ask the operator "
                "to raise the limit.", reason="per_device", device=device,
                limit=limits.max_sessions_per_device)
        return None

    def _on_devices(self, identity: bytes, message: Message, now: float) -> list[Send]:
        if not self._token_ok(message.body["token"], self._client_token):
            return self._token_refused(self._reject(identity, message.header, AuthenticationError(
                "The broker refused the token: check the client token you were given.")), now)
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
        return [self._message(Side.BACKEND, session.lane, Message(
            Kind.CLOSE, session.id, message.request))]

    def _on_ping(self, identity: bytes, message: Message, now: float) -> list[Send]:
        for session in self.sessions.values():
            if session.client == identity:
                session.last_seen = now
        return [self._message(Side.FRONTEND, identity, Message(
            Kind.PONG, message.session, message.request))]

    def _on_admin(self, identity: bytes, message: Message, now: float) -> list[Send]:
        from . import admin  # it reads this module's state; imported late to avoid a cycle

        if not self._token_ok(message.body["token"], self._admin_token):
            self.rejects["admin_unauthorized"] += 1
            log.warning("refused an admin command from %s: not the admin token",
                        identity.hex())
            return self._token_refused([self._error(Side.FRONTEND, identity, AuthenticationError(
                "The broker refused the token: admin commands need the admin token "
                "(FABRIC_ADMIN_TOKEN, or the admin_token of the connection file)."),
                kind=Kind.REJECT, request=message.request)], now)
        command = message.body["command"]
        try:
            result, sends = admin.run(self, command, message.body["args"], now)
        except FabricError as exc:
            self.counters["admin_errors"] += 1
            return [self._error(Side.FRONTEND, identity, exc, request=message.request)]
        self.counters["admin_commands"] += 1
        log.info("admin command %s from %s", command, identity.hex())
        return sends + [self._message(Side.FRONTEND, identity, Message(
            Kind.ADMIN_REPLY, 0, message.request, {"command": command, "result": result}))]

    _client_handlers = {
        Kind.HELLO: _on_hello,
        Kind.DEVICES: _on_devices,
        Kind.CLOSE: _on_close,
        Kind.PING: _on_ping,
        Kind.ADMIN: _on_admin,
    }

    # -- workers -----------------------------------------------------------------------

    def from_worker(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """A message from the backend (routing identity already split off)."""
        header = None  # once read, an error answer names the request it answers
        try:
            if not frames:
                raise ProtocolError("A message needs a header frame.")
            header = protocol.decode_header(frames[0])
            worker = self._worker_or_lane_owner(identity)
            if (worker is not None and identity in self._lane_owner
                    and identity not in worker.attached and header.kind == Kind.HEARTBEAT):
                self._attach(worker, identity)
            if worker is not None:
                worker.last_seen = now
                if header.kind in WORKER_DATA_KINDS and header.version == PROTOCOL_VERSION:
                    protocol.check_frames(header, frames)
                    return self._route_worker_data(worker, header, frames)
            if header.kind == Kind.REGISTER:
                if header.version != PROTOCOL_VERSION:
                    self.rejects["worker_version_mismatch"] += 1
                    return [self._error(Side.BACKEND, identity, VersionMismatch(
                        f"The worker speaks protocol version {header.version} and this broker "
                        f"speaks {PROTOCOL_VERSION}: install matching fabric versions.",
                        client_version=header.version, server_version=PROTOCOL_VERSION),
                        kind=Kind.REJECT)]
                return self._on_register(identity, protocol.decode(frames, header), now)
            if worker is None:
                self.counters["unregistered_worker_messages"] += 1
                log.warning("message from unregistered worker %s", identity.hex())
                return [self._error(Side.BACKEND, identity, ProtocolError(
                    "This worker is not registered: send REGISTER first.",
                    reason="not_registered"), session=header.session, request=header.request)]
            message = protocol.decode(frames, header)
        except ProtocolError as exc:
            return self._bad_input(Side.BACKEND, identity, exc, header)
        if message.version != PROTOCOL_VERSION:  # its body was not validated
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                f"Protocol version {message.version} is not {PROTOCOL_VERSION}: "
                "install matching fabric versions.", worker_version=message.version,
                server_version=PROTOCOL_VERSION), header)
        handler = self._worker_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                f"A {message.kind.name} message is not accepted from a worker."), header)
        return handler(self, worker, message, now)

    def _route_worker_data(self, worker: Worker, header: Header,
                           frames: Sequence[Any]) -> list[Send]:
        session = self.sessions.get(header.session)
        if header.kind == Kind.TRANSFER:
            # A tensor moving between sessions: the sender must own the source session (the
            # request field); knowing the destination's random 64-bit id is the capability.
            source = self.sessions.get(header.request)
            if (source is None or source.worker != worker.identity or session is None
                    or session.state != SessionState.OPEN):
                self.counters["refused_transfers"] += 1
                return []
            session.messages += 1
            session.bytes += _frames_size(frames)
            destination = self.workers[session.worker]
            if largest_frame(frames) > destination.max_message_bytes:
                return self._transfer_too_large(destination, session, header, frames)
            return [_new(Send, (Side.BACKEND, session.lane, list(frames), 0.0))]
        if session is None or session.worker != worker.identity:
            self.counters["stale_worker_data"] += 1  # the session closed meanwhile
            return []
        session.messages += 1
        session.bytes += _frames_size(frames)
        return [_new(Send, (Side.FRONTEND, session.client, list(frames), 0.0))]

    def _transfer_too_large(self, destination: Worker, session: Session, header: Header,
                            frames: Sequence[Any]) -> list[Send]:
        """A TRANSFER bigger than its destination worker takes: the tensor arrives as the
        error instead (the body is decoded only on this rare path)."""
        self.counters["transfers_too_large"] += 1
        try:
            tensor = protocol.decode(frames, header).body.get("id")
        except ProtocolError:
            return []
        limit = destination.max_message_bytes
        error = MessageTooLarge(
            f"The tensor moved with .to() is {size_text(largest_frame(frames))}, more than "
            f"the {size_text(limit)} worker {destination.name} takes in one message: move "
            "it in slices, or start that worker with a larger --max-message-bytes.",
            size=largest_frame(frames), limit=limit)
        return [self._message(Side.BACKEND, session.lane, Message(
            Kind.TRANSFER, header.session, header.request,
            {"id": tensor, "error": error.to_wire()}))]

    def _on_register(self, identity: bytes, message: Message, now: float) -> list[Send]:
        body = message.body
        if not self._token_ok(body["token"], self._worker_token):
            self.rejects["worker_unauthorized"] += 1
            log.warning("refused a worker registration from %s: bad worker token",
                        identity.hex())
            return self._token_refused([self._error(Side.BACKEND, identity, AuthenticationError(
                "The broker refused the worker token: start the worker with the cluster's "
                "worker token."), kind=Kind.REJECT)], now)
        if not all(isinstance(d, dict) for d in body["devices"]):
            return self._bad_input(Side.BACKEND, identity, ProtocolError(
                "REGISTER devices must be a list of maps."), message.header)
        lanes = body.get("lanes", [])
        refused = self._lanes_refused(identity, body["name"], lanes, len(body["devices"]))
        if refused is not None:
            return self._bad_input(Side.BACKEND, identity, refused, message.header)
        sends: list[Send] = []
        for old in self._replaced_by(identity, body["name"]):
            sends += self._lose_worker(old, "the worker re-registered")
        self.workers[identity] = Worker(
            identity, body["name"], body["backend"], list(body["devices"]), registered=now,
            last_seen=now, max_message_bytes=_size_limit(body, self.limits.max_message_bytes),
            lanes=list(lanes))
        self._lane_owner.update(dict.fromkeys(lanes, identity))
        self._known.pop(body["name"], None)  # re-inserted last: the newest is forgotten last
        self._known[body["name"]] = len(body["devices"])
        self._rebuild_devices()
        log.info("worker %s registered with %d %s device(s)", body["name"],
                 len(body["devices"]), body["backend"])
        sends.append(self._message(Side.BACKEND, identity, Message(
            Kind.REGISTERED, 0, message.request,
            {"server": self.server, "heartbeat": self.limits.heartbeat,
             "max_message_bytes": self.limits.max_message_bytes})))
        return sends

    def _replaced_by(self, identity: bytes, name: str) -> list[Worker]:
        """The workers a registration from ``identity`` as ``name`` replaces: a worker that
        restarted (same name) or reconnected (same socket) replaces its earlier self."""
        return [w for w in self.workers.values() if w.name == name or w.identity == identity]

    def _lanes_refused(self, identity: bytes, name: str, lanes: Any,
                       devices: int) -> ProtocolError | None:
        """Why REGISTER's ``lanes`` cannot be used, or None: one distinct identity per
        device, none of them another peer's (a worker re-registering may reuse its own)."""
        if identity in self._lane_owner:
            return ProtocolError("A device lane cannot register: register from the worker's "
                                 "own socket.")
        if not isinstance(lanes, list) or (lanes and len(lanes) != devices) or not all(
                isinstance(lane, bytes) and 0 < len(lane) < 256 and lane[0] != 0
                for lane in lanes):
            return ProtocolError("REGISTER lanes must list one routing identity per device "
                                 "(1-255 bytes, not starting with a zero byte).")
        own = {w.identity for w in self._replaced_by(identity, name)} | {identity}
        taken = [lane for lane in lanes if lane == identity or lane in self.workers
                 or self._lane_owner.get(lane, identity) not in own]
        if taken or len(set(lanes)) != len(lanes):
            return ProtocolError("REGISTER lanes must be distinct and not another peer's "
                                 "routing identity: choose fresh random ones.")
        return None

    def _attach(self, worker: Worker, lane: bytes) -> None:
        """A lane was heard from: routable now; the worker's devices come online with the
        last of its lanes."""
        worker.attached.add(lane)
        if worker.ready:
            log.info("worker %s: all %d device lanes attached", worker.name, len(worker.lanes))
            self._rebuild_devices()

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
             "server": self.server, "heartbeat": self.limits.heartbeat,
             "max_message_bytes": min(self.limits.max_message_bytes,
                                      worker.max_message_bytes)}))]

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
        session.errors += 1
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
        if self.sessions.pop(session.id, None) is None:
            return
        worker = self.workers[session.worker]  # a session never outlives its worker here
        worker.sessions.discard(session.id)
        held = self.client_sessions.get(session.client)
        if held is not None:
            held.discard(session.id)
            if not held:
                del self.client_sessions[session.client]
        key = (session.worker, session.local)
        self._device_sessions[key] -= 1
        if self._device_sessions[key] <= 0:
            del self._device_sessions[key]
        self.retired.setdefault((worker.name, session.local), Traffic()).add(session)

    def _end_for_client(self, session: Session, *, opening: FabricError,
                        lost: FabricError) -> Send:
        """What tells a session's client that the broker ended it, by the session's state:
        ``opening`` is the REJECT of a pending HELLO, ``lost`` the ERROR for an open session;
        a client that was closing gets its CLOSED."""
        if session.state == SessionState.OPENING:
            self.rejects[str(opening.details.get("reason", opening.code))] += 1
            return self._error(Side.FRONTEND, session.client, opening, kind=Kind.REJECT,
                               session=session.id, request=session.hello_request)
        if session.state == SessionState.CLOSING:
            return self._message(Side.FRONTEND, session.client, Message(
                Kind.CLOSED, session.id, session.hello_request))
        return self._error(Side.FRONTEND, session.client, lost, session=session.id)

    def _drop_session(self, session: Session, *, notify_worker: bool) -> list[Send]:
        self._forget(session)
        if notify_worker and session.worker in self.workers:
            return [self._message(Side.BACKEND, session.lane,
                                  Message(Kind.CLOSE, session.id, 0))]
        return []

    def _lose_worker(self, worker: Worker, why: str) -> list[Send]:
        """Forget a worker and tell every client with a session on it."""
        log.warning("worker %s lost: %s", worker.name, why)
        self.counters["workers_lost"] += 1
        sends: list[Send] = []
        for session_id in sorted(worker.sessions):
            session = self.sessions[session_id]
            device = self.device_of(session)["index"]
            self._forget(session)
            sends.append(self._end_for_client(session, opening=HandshakeError(
                f"Worker {worker.name} owning device {device} was lost while the session "
                f"was opening ({why}): retry, or choose another device.",
                device=device, worker=worker.name, reason="worker_lost"), lost=SessionLost(
                f"Session {session.id:#x} on device {device} is lost: worker "
                f"{worker.name} {why}. Open a new session.",
                device=device, worker=worker.name, session=session.id)))
        del self.workers[worker.identity]
        for lane in worker.lanes:
            del self._lane_owner[lane]
        self._rebuild_devices()
        return sends

    def _lose_client(self, identity: bytes, why: str) -> list[Send]:
        sends: list[Send] = []
        for session in [self.sessions[s] for s in sorted(self.client_sessions.get(identity, ()))]:
            log.info("session %#x dropped: %s", session.id, why)
            self.counters["sessions_expired"] += 1
            sends += self._drop_session(session, notify_worker=True)
        return sends

    def unroutable(self, side: Side, identity: bytes, now: float) -> list[Send]:
        """The I/O loop could not deliver to this peer: it has disconnected."""
        if side == Side.BACKEND:
            worker = self._worker_or_lane_owner(identity)
            return self._lose_worker(worker, "disconnected") if worker else []
        return self._lose_client(identity, "the client disconnected")

    def cut_client(self, identity: bytes, queued: int) -> list[Send]:
        """End every session of a client that left ``queued`` messages unread, the most the
        broker holds for one peer: closed on their workers (freeing their memory), and a
        notice for each, which reaches the client only if it reads again. A client with no
        session left is not cut again: its queue filled with answers about sessions it was
        cut from (its last words left the broker, which does not mean it read them)."""
        sessions = [self.sessions[s] for s in sorted(self.client_sessions.get(identity, ()))]
        if not sessions:
            return []
        self.counters["clients_cut"] += 1
        log.warning("client %s left %d messages unread: its sessions are ended",
                    identity.hex(), queued)
        sends: list[Send] = []
        for session in sessions:
            self.counters["sessions_cut"] += 1
            sends += self._drop_session(session, notify_worker=True)
            sends.append(self._end_for_client(session, opening=HandshakeError(
                f"The broker ended the session while it was opening: the client left "
                f"{queued} messages unread. Read replies as they come, then open a new "
                "session.", reason="client_not_reading"), lost=SessionLost(
                f"Session {session.id:#x} was ended by the broker: the client left {queued} "
                "messages unread, the most the broker holds for one client. Read replies "
                "as they come (one connection per thread), then open a new session.",
                session=session.id, reason="client_not_reading")))
        return sends

    def lose_worker(self, identity: bytes, why: str) -> list[Send]:
        """Declare a worker lost for the I/O loop (say, it took nothing sent to it for too
        long): its clients are told, as when it dies."""
        worker = self._worker_or_lane_owner(identity)
        return self._lose_worker(worker, why) if worker is not None else []

    def _worker_or_lane_owner(self, identity: bytes) -> Worker | None:
        return self.workers.get(identity) or self.workers.get(self._lane_owner.get(identity))

    def next_deadline(self) -> float:
        """When ``tick`` next has work to do: the next heartbeat, or the next scan of
        deadlines (four per heartbeat interval, so no message pays for a scan)."""
        return min(self._next_heartbeat, self._next_scan)

    def _heartbeat(self, identity: bytes, sessions: Any) -> Send:
        return self._message(Side.BACKEND, identity, Message(
            Kind.HEARTBEAT, body={"sessions": sorted(sessions)}))

    def tick(self, now: float) -> list[Send]:
        """Heartbeats, lost workers, handshake and close deadlines, idle-client probes."""
        sends: list[Send] = []
        limits = self.limits
        self._next_scan = now + limits.heartbeat / 4
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + limits.heartbeat
            # Each lists the sessions here: the worker closes any other (a lost CLOSE).
            for worker in self.workers.values():
                sends.append(self._heartbeat(worker.identity, worker.sessions))
                for local, lane in enumerate(worker.lanes if worker.ready else ()):
                    sends.append(self._heartbeat(lane, [
                        s for s in worker.sessions if self.sessions[s].local == local]))
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

    # -- administration (the commands are in broker.admin) -----------------------------------

    def close_session(self, session_id: int) -> list[Send]:
        """End a session for an administrator: closed on its worker, its client told.

        Raises NotFound, changing nothing, when the broker has no such session.
        """
        session = self.sessions.get(session_id)
        if session is None:
            raise NotFound(f"Session {session_id:#x} does not exist on this broker: list the "
                           "open ones with fabric admin sessions.", session=session_id)
        device = session.device
        sends = self._drop_session(session, notify_worker=True)
        sends.append(self._end_for_client(session, opening=HandshakeError(
            f"The session on device {device} was closed by an administrator while it was "
            "opening: open a new session.", device=device, reason="closed_by_admin"),
            lost=SessionLost(
            f"Session {session.id:#x} on device {device} was closed by an administrator: "
            "open a new session.", device=device, session=session.id,
            reason="closed_by_admin")))
        self.counters["sessions_closed_by_admin"] += 1
        log.info("session %#x closed by an administrator", session.id)
        return sends

    def worker_named(self, name: str) -> Worker:
        """The connected worker called ``name``; NotFound when there is none."""
        for worker in self.workers.values():
            if worker.name == name:
                return worker
        known = ", ".join(sorted((w.name for w in self.workers.values()), key=_natural))
        raise NotFound(f"No worker named {name!r} is connected to this broker "
                       f"(connected: {known or 'none'}): list them with fabric admin workers.",
                       worker=name)

    def drain(self, name: str, draining: bool = True) -> Worker:
        """Stop (or, with ``draining=False``, resume) new sessions on a worker's devices.

        Existing sessions go on. Raises NotFound, changing nothing, for an unknown worker.
        """
        worker = self.worker_named(name)
        worker.draining = draining
        log.info("worker %s %s by an administrator", name,
                 "drained" if draining else "undrained")
        return worker

    def shutdown(self) -> list[Send]:
        """Tell every client its session ends because the broker stops."""
        sends = []
        for session in self.sessions.values():
            sends.append(self._error(Side.FRONTEND, session.client, SessionLost(
                "The broker is shutting down: open a new session when it is back.",
                session=session.id), session=session.id))
        return sends

    def status(self, now: float) -> dict[str, Any]:
        """A summary for logs and the admin ``status`` command."""
        from . import admin

        return admin.status(self, now)
