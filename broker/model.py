"""The broker's records: what a session, a worker, a device's traffic, the limits and an
outgoing message are.

Rule: plain data, imported by every other broker module and importing none of them, so the
rooms that share these records (registry, worker table, session table, admin, flow control,
held answers) never import each other in a circle. A record changes only through the room
that owns it: a session's phase through ``broker.sessions``'s transition table, a worker's
lanes and device numbering through ``broker.worker_table``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fabric.core import protocol
from fabric.core.errors import FabricError
from fabric.core.flow import (
    DEFAULT_HWM,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_MAX_SESSIONS_PER_DEVICE,
    DEFAULT_PEER_QUEUE,
    DEFAULT_RESUME_GRACE,
)
from fabric.core.protocol import Kind, Message


class Side(str, enum.Enum):  # (a str: hashed in C; a plain Enum's __hash__ is Python code)
    FRONTEND = "frontend"  # clients and admin
    WORKERS = "workers"  # workers (their lanes and beacons)
    ZAP = "zap"  # libzmq asking whether a connecting peer may finish its handshake


class Send(NamedTuple):
    """One message for the I/O loop to send: to which socket, which peer, which frames, and
    not before when (the answer to a refused token waits ``Limits.auth_delay``; 0 is now)."""

    side: Side
    identity: bytes
    frames: list[Any]
    not_before: float = 0.0


# Data messages are forwarded as ``new_send(Send, (side, identity, frames, 0.0))``: the named
# tuple's own ``__new__`` is a Python call, on every message (see ``fabric.core.protocol``).
new_send = tuple.__new__


def send_message(side: Side, identity: bytes, message: Message) -> Send:
    """A control message the broker itself composes, encoded for the I/O loop."""
    return Send(side, identity, protocol.encode(message))


def send_error(side: Side, identity: bytes, error: FabricError, *, kind: Kind = Kind.ERROR,
               session: int = 0, request: int = 0) -> Send:
    """An error (or, with ``kind=REJECT``, a refusal) carrying its code and sentence."""
    return send_message(side, identity, protocol.error_message(
        error, kind=kind, session=session, request=request))


class SessionPhase(enum.Enum):
    """Where a session is in its life; it moves only by ``broker.sessions.PHASE_AFTER``."""

    OPENING = "opening"  # HELLO accepted, waiting for the worker's OPENED
    OPEN = "open"
    CLOSING = "closing"  # CLOSE forwarded, waiting for the worker's CLOSED
    # Reported by its worker after a takeover (``broker.resume``), waiting for its client's
    # RESUME until its deadline
    RESUMABLE = "resumable"
    ENDED = "ended"  # forgotten by the broker (closed, refused, expired, lost, cut)


class Directions:
    """Data traffic counted by direction: ``_in`` towards a device (a client's messages, and
    tensors moving from another device), ``_out`` from a device to its client."""

    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int

    @property
    def messages(self) -> int:
        """Data messages both ways."""
        return self.messages_in + self.messages_out

    @property
    def bytes(self) -> int:
        """Data bytes both ways."""
        return self.bytes_in + self.bytes_out


@dataclass
class Session(Directions):
    id: int
    client: bytes
    device: int  # global index: fixed for the broker's life (``broker.worker_table``)
    local: int  # index on its worker
    worker: bytes
    lane: bytes  # where its messages go: the device's own socket, or the worker's
    phase: SessionPhase
    created: float
    last_seen: float
    hello_request: int  # the HELLO's request id: WELCOME or REJECT answers it
    token: int = 0  # which of the broker's client tokens opened it (its index)
    close_request: int = 0  # the CLOSE's request id, once the client asked: CLOSED answers it
    deadline: float = float("inf")  # for OPENING and CLOSING
    client_max: int = DEFAULT_MAX_MESSAGE_BYTES  # the largest frame the client's socket takes
    probed: float = 0.0  # when the broker last checked an idle client was still there
    messages_in: int = 0  # data messages and bytes by direction (``Directions``)
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    submits: int = 0  # batches of ops: SUBMITs and CARRIES_BATCH requests (bodies unread)
    errors: int = 0  # ERROR messages from the worker about this session
    secret_digest: bytes = b""  # reported by its worker after a takeover: RESUME checks it


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
    beacon: bytes = b""  # its link's beacon: ZMTP heartbeats only (``broker.registry``)
    attached: set[bytes] = field(default_factory=set)  # lanes heard from since REGISTER
    instance: bytes = b""  # the worker process's random id: its reconnections carry it too
    host: str = ""  # the host name it reports in REGISTER
    address: str = ""  # its address as the broker sees it (ZeroMQ's Peer-Address), if any
    bulk: dict[str, Any] | None = None  # its direct links' endpoint (``link_grants``), if any
    report: protocol.WorkerReport | None = None  # its last heartbeat's (``decode_report``)

    @property
    def ready(self) -> bool:
        """Whether every lane has been heard from, so that messages to it are routable."""
        return len(self.attached) == len(self.lanes)

    def lane(self, local: int) -> bytes:
        """Where messages for device ``local`` go: its lane, else the worker's socket."""
        return self.lanes[local] if self.lanes else self.identity


REPORTED = ("resident_bytes", "ops", "op_seconds", "graph_replays", "graph_registrations",
            "queued", "shm_in", "shm_in_bytes", "shm_out", "shm_out_bytes",
            "pool_bytes")  # what admin views show of a device's ``protocol.DeviceReport``


def reported(worker: Worker | None, local: int) -> dict[str, Any]:
    """What ``worker`` last reported of its device ``local``: each figure of ``REPORTED``, or
    None where it has said nothing yet (or is gone)."""
    device = worker.report.device(local) if worker and worker.report else None
    return {name: device and getattr(device, name) for name in REPORTED}


@dataclass
class Traffic(Directions):
    """Totals of the sessions that have ended on one device (by worker name, local index)."""

    sessions: int = 0
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    submits: int = 0
    errors: int = 0

    def add(self, session: Session | Traffic) -> None:
        """Fold a session's (or another total's) counts into this one."""
        self.messages_in += session.messages_in
        self.bytes_in += session.bytes_in
        self.messages_out += session.messages_out
        self.bytes_out += session.bytes_out
        self.submits += session.submits
        self.errors += session.errors
        self.sessions += session.sessions if isinstance(session, Traffic) else 1


@dataclass(frozen=True)
class Limits:
    """Timing rules and resource limits; the defaults suit a LAN, tests shorten them."""

    heartbeat: float = 1.0  # seconds between heartbeats to workers
    liveness: int = 3  # heartbeats a link may miss: past them a silent connection is closed
    open_timeout: float = 5.0  # how long a worker may take to open (or close) a session
    lease: float = 10.0  # idle time after which the broker checks a client is still there
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # MAXMSGSIZE of both sockets
    max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT  # per client connection
    max_sessions_per_device: int = DEFAULT_MAX_SESSIONS_PER_DEVICE
    # Sessions one client token may hold on one device; None: the per-device limit shared
    # evenly among the client tokens, so no token holder can lock another out of a device.
    max_sessions_per_token: int | None = None
    hwm: int = DEFAULT_HWM  # SNDHWM and RCVHWM of both sockets, per peer
    peer_queue: int = DEFAULT_PEER_QUEUE  # messages parked for a peer whose queue is full
    # How long a worker's parked queue may stay full (the frontend unread meanwhile) before
    # it is lost; None: 2/3 of heartbeat x liveness, under the clients' heartbeat timeout
    # (fabric.core.flow), which would drop the connections of clients whose sends wait meanwhile.
    slow_peer_timeout: float | None = None
    auth_delay: float = 0.2  # a refused token is answered this much later (the loop holds it)
    # How long a peer has to finish the ZeroMQ handshake, its token included: connections that
    # send nothing, junk, or wait on a refusal the full held queue dropped are closed then.
    handshake_timeout: float = 10.0
    # After a takeover (``broker.resume``): how long a session its worker reported waits for
    # its client's RESUME, and the longest clients wait for the last known table's workers to
    # report (None: heartbeat x liveness x 2, time for a worker to find its broker gone).
    resume_grace: float = DEFAULT_RESUME_GRACE
    settle: float | None = None

    @property
    def settle_time(self) -> float:
        """``settle``, or its default from the heartbeat."""
        return self.settle if self.settle is not None else self.heartbeat * self.liveness * 2

    def sessions_per_token(self, client_tokens: int) -> int:
        """``max_sessions_per_token``, or its default for this many client tokens."""
        if self.max_sessions_per_token is not None:
            return self.max_sessions_per_token
        return max(1, self.max_sessions_per_device // max(1, client_tokens))

    @property
    def slow_worker_timeout(self) -> float:
        """``slow_peer_timeout``, or its default from the heartbeat."""
        if self.slow_peer_timeout is not None:
            return self.slow_peer_timeout
        return self.heartbeat * self.liveness * 2 / 3
