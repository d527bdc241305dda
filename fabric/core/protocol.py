"""The fabric wire protocol, sans I/O: message kinds, the header frame, bodies, validation.

Rule: every rule about what goes on the wire lives here, and nothing here touches a socket,
a thread or a clock. Decoding any bytes either returns a valid ``Message`` or raises
``ProtocolError``; nothing else escapes.

A message is a list of frames::

    [header, body, *buffers]

``header`` is a fixed 22-byte struct (magic, version, kind, flags, session id, request id);
``body`` is a msgpack map; ``buffers`` are raw array bytes described by the body. The broker
routes data kinds by the header alone and never decodes their body or buffers.

An empty body is left out, and the header's ``NO_BODY`` flag says so: ``[header, *buffers]``.
Every frame costs each process on the way a send and a receive (measured about 20 µs per
request/reply round trip through a broker), and many messages (heartbeats, OPENED, a read's
reply) have nothing to say beyond their header and buffers.

What a peer chooses is bounded here, before anything keeps it: the body of a message a
client or worker sends a server to open or run its conversation (HELLO, DEVICES, CLOSE, PING,
ADMIN; REGISTER) is refused past ``CONTROL_BODY_BYTES`` before it is unpacked, and a label
(the client label a session keeps, a worker's name, backend and host) past
``MAX_LABEL_CHARS``: a ProtocolError that says so, never a string kept as long as it came.
"""

from __future__ import annotations

import enum
import struct
import threading
from typing import Any, NamedTuple, Sequence

import msgpack

from fabric.core.errors import FabricError, ProtocolError

# Bumped when a peer of the old version would misread the new one: 2, a SUBMIT's frees stand
# among its ops (an old worker would refuse them as malformed ops, a new one would ignore an
# old client's 'free' list and hold its tensors until the session closes); 3, an op without
# params may travel in its compact form (fabric.core.wire), which an old worker would refuse; 4, an
# index travels packed as bytes (fabric.core.wire.pack_index), which an old worker would refuse.
PROTOCOL_VERSION = 4
MAGIC = b"FB"
HEADER = struct.Struct("!2sHBBQQ")  # magic, version, kind, flags, session id, request id
HEADER_SIZE = HEADER.size
NO_BODY = 0x01  # header flag: the body is the empty map and its frame is left out
# header flag: a REQUEST that carries its session's batch of ops (body "ops", and the batch's
# buffers), run before it as a SUBMIT would be; the broker counts it as one without decoding
CARRIES_BATCH = 0x02
MAX_ID = 2**64 - 1
MAX_LABEL_CHARS = 255  # a label a peer gives (a session's client, a worker's name), at most


class Kind(enum.IntEnum):
    """Every message kind; the comment names who sends it to whom."""

    # client <-> broker, control
    HELLO = 1  # client -> broker: open a session
    WELCOME = 2  # broker -> client: session open
    REJECT = 3  # broker -> client: handshake refused (code, reason)
    CLOSE = 4  # client -> broker -> worker: close a session
    CLOSED = 5  # worker -> broker -> client
    DEVICES = 6  # client -> broker: list devices
    DEVICE_LIST = 7  # broker -> client
    ERROR = 8  # anyone -> anyone: typed error about a session or request
    PING = 9  # liveness probe, answered by PONG
    PONG = 10
    # client -> broker: take up a session on the broker that took over from the one that
    # opened it (the session's secret, given at WELCOME, and the client token); RESUMED
    # answers it as WELCOME does, with how many of its batches the device has run
    RESUME = 11
    RESUMED = 12
    # worker <-> broker, control
    REGISTER = 20  # worker -> broker: token, name, devices
    REGISTERED = 21  # broker -> worker
    HEARTBEAT = 22  # both ways; any traffic also counts as a heartbeat
    OPEN = 23  # broker -> worker: open a session on a local device
    OPENED = 24  # worker -> broker
    # worker <-> broker: a direct link for a large TRANSFER (``workers.direct_links``); the
    # header's session is the destination session, its request the sender's link number
    LINK = 25  # sending worker -> broker: may this TRANSFER go to its worker directly?
    LINK_GRANT = 26  # broker -> sending worker: the receiver's bulk address and a ticket
    LINK_EXPECT = 27  # broker -> receiving worker: admit that ticket once, for that session
    # admin <-> broker, control: answered by the broker itself, no session needed
    ADMIN = 30  # admin -> broker: a command (token, command, args)
    ADMIN_REPLY = 31  # broker -> admin: the command's result
    # data, routed by session id; the broker never decodes these bodies
    SUBMIT = 40  # client -> worker: a batch of fire-and-forget ops, and tensors freed among them
    REQUEST = 41  # client -> worker: a read or sync that expects a REPLY
    REPLY = 42  # worker -> client
    # worker -> broker -> worker: a tensor moved between sessions; the header's session is
    # the destination session and its request field the source session
    TRANSFER = 43
    CREDIT = 44  # worker -> client: how many of the session's SUBMITs the device has run


CLIENT_DATA_KINDS = frozenset({Kind.SUBMIT, Kind.REQUEST})
WORKER_DATA_KINDS = frozenset({Kind.REPLY, Kind.TRANSFER, Kind.CREDIT})
DATA_KINDS = CLIENT_DATA_KINDS | WORKER_DATA_KINDS
_KIND_OF = {int(k): k for k in Kind}  # a dict lookup: Kind(n) is ten times slower
KNOWN_KINDS = frozenset(_KIND_OF)

# Required body fields per control kind, with their types. Extra fields are allowed (newer
# minor additions); missing or mistyped ones are a ProtocolError naming the field.
# Optional fields, ignored when absent or not of their type:
# - ``max_message_bytes`` (int): in HELLO and REGISTER the largest frame the sender's socket
#   takes; in WELCOME the largest the client may upload to the session's device, in OPEN
#   the largest the worker may reply with, in REGISTERED the largest the broker takes;
# - ``sessions`` (list of ids) in the broker's HEARTBEAT: the sessions it holds on that
#   worker (or, on a device's lane, on that device), which closes any other;
# - ``lanes`` (list of routing identities, one per device) in REGISTER: each device's own
#   socket, to which the broker sends that device's sessions' messages;
# - ``beacon`` (a routing identity) in REGISTER: the worker's socket that carries only
#   libzmq's ZMTP heartbeats; the broker finds the worker's link gone when it is unroutable;
# - ``fabric_version`` (str) in REGISTER: the worker's fabric release, which must be the
#   broker's;
# - ``host`` (str) in REGISTER: the worker's host name, for the admin's views.
# - ``sessions`` (list of [id, device, owner, secret digest, submits]) in REGISTER: the
#   sessions a worker of a pair kept when its broker went (``workers.held_sessions``);
#   ``owner`` (bytes) in OPEN: the digest of the client token that opened the session;
#   ``secret`` (bytes) in OPENED and WELCOME: the session's resume secret (``RESUME``).
# - ``bulk`` (map) in REGISTER: the worker's direct-link endpoint, ``address`` (str) and, with
#   CURVE, ``public_key`` (z85 bytes); LINK_GRANT passes it on, with the ``ticket``, or is
#   empty where the TRANSFER must take the broker.
# - ``report`` in a worker's own HEARTBEAT: what its devices did (``WorkerReport``), checked
#   by ``decode_report``: malformed, it is a ProtocolError, not ignored.
_ERROR_FIELDS = {"code": str, "message": str, "details": dict}
BODY_SCHEMAS: dict[Kind, dict[str, type | tuple[type, ...]]] = {
    Kind.HELLO: {"token": str, "device": int},
    Kind.WELCOME: {"device": dict, "device_count": int, "server": str, "heartbeat": (int, float)},
    Kind.REJECT: _ERROR_FIELDS,
    Kind.ERROR: _ERROR_FIELDS,
    Kind.DEVICES: {"token": str},
    Kind.RESUME: {"token": str, "secret": bytes},
    Kind.RESUMED: {"device": dict, "device_count": int, "server": str, "submits": int},
    Kind.DEVICE_LIST: {"devices": list, "server": str},
    Kind.REGISTER: {"token": str, "name": str, "backend": str, "devices": list},
    Kind.REGISTERED: {"server": str, "heartbeat": (int, float)},
    Kind.OPEN: {"device": int},
    Kind.REQUEST: {"op": str},
    Kind.ADMIN: {"token": str, "command": str, "args": dict},
    Kind.ADMIN_REPLY: {"command": str, "result": dict},
    Kind.CREDIT: {"done": int},
    Kind.LINK: {"source": int, "nbytes": int},
    Kind.LINK_EXPECT: {"ticket": bytes},
}


# The bodies a server takes from its peers, bounded before they are unpacked: what fabric's
# client and worker send is far smaller (a HELLO is about 100 bytes; a REGISTER some 200 per
# device), and a peer holding a token must not make the server unpack a string of 256 MiB.
CONTROL_BODY_BYTES = {Kind.HELLO: 64 << 10, Kind.DEVICES: 64 << 10, Kind.CLOSE: 64 << 10,
                      Kind.RESUME: 64 << 10,
                      Kind.PING: 64 << 10, Kind.ADMIN: 64 << 10, Kind.REGISTER: 1 << 20}
# The labels of each kind that a peer chooses (optional or not): each is a str of at most
# MAX_LABEL_CHARS, or a ProtocolError (one that is not a str is the schema's business).
LABEL_FIELDS = {Kind.HELLO: ("client",), Kind.OPEN: ("client",),
                Kind.REGISTER: ("name", "backend", "host")}


# What a worker reports in its heartbeats, for the broker's metrics. Op time is measured per
# batch (a SUBMIT's ops run together, and a clock read per op would slow the op loop) and
# each op of the batch is counted in the bucket of the batch's time per op: a histogram of
# ops (its count is the ops run) by seconds per op, with these upper bounds (and +Inf):
# decades, as every bucket is a sample each scrape renders, for each device.
OP_SECONDS_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)
_MAX_COUNT = 2**63 - 1  # what a reported count or size may be at most
_MAX_SESSION_ID = 2**64 - 1  # (a header's unsigned 64 bits)


class DeviceReport(NamedTuple):
    """What one device did since its worker started (counts only grow), and holds now."""

    resident_bytes: int  # what its sessions' tensors hold
    op_buckets: tuple[int, ...]  # ops by seconds per op, one per OP_SECONDS_BUCKETS and +Inf
    op_seconds: float  # the time those ops took, in all
    graph_replays: int  # calls of a graph already called once: the graph cache's hits
    graph_registrations: int  # graphs registered (traced and sent by a client)
    queued: int  # messages read from its lane, waiting to run
    # Bulk traffic past the broker, through shared memory with clients on its host: uploads
    # and moves that came in through it, reads and moves that went out through it (written
    # into a client's slot, or a slot of the device's lent as a read-only view), each a count
    # and its bytes; and the bytes of the device's own pool now (segments free or lent)
    shm_in: int = 0
    shm_in_bytes: int = 0
    shm_out: int = 0
    shm_out_bytes: int = 0
    pool_bytes: int = 0

    @property
    def ops(self) -> int:
        """Ops run (the histogram's count)."""
        return sum(self.op_buckets)


class LinkReport(NamedTuple):
    """What a worker's direct links carried since it started (counts only grow): tensors
    sent and received on them, with their bytes, and those that fell back to the broker (no
    grant or connection in time, or a link that broke before the receiver took it)."""

    sent: int = 0
    sent_bytes: int = 0
    received: int = 0
    received_bytes: int = 0
    fallbacks: int = 0


class SessionReport(NamedTuple):
    """What a device holds and ran for one session, now: the dashboard's session rows."""

    session: int
    resident_bytes: int  # its tensors' bytes
    ops: int  # ops its batches carried


# A heartbeat names at most this many sessions (a worker's first ones, in the order its
# devices took them): enough for the dashboard's rows, and a heartbeat stays small
MAX_REPORTED_SESSIONS = 256


class WorkerReport(NamedTuple):
    """A worker's report: its memory budget (None: no limit), one entry per device, the
    peers its direct-link endpoint refused (no ticket, a wrong or used one), what its
    direct links carried, and its sessions (``MAX_REPORTED_SESSIONS`` at most)."""

    budget_bytes: int | None
    devices: tuple[DeviceReport, ...]
    link_refusals: int = 0
    links: LinkReport = LinkReport()
    sessions: tuple[SessionReport, ...] = ()

    def device(self, local: int) -> DeviceReport | None:
        """The report of device ``local``; None where the worker has no such device (a name
        that registered again with fewer devices keeps its old device indexes)."""
        return self.devices[local] if 0 <= local < len(self.devices) else None


def report_body(report: WorkerReport) -> dict[str, Any]:
    """The ``report`` field of a worker's HEARTBEAT (a device as a list, in field order:
    a heartbeat stays small, a few dozen bytes per device)."""
    return {"report": [report.budget_bytes, [list(device) for device in report.devices],
                       report.link_refusals, list(report.links),
                       [list(session) for session in report.sessions]]}


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_COUNT


def _device_report(entry: Any) -> DeviceReport:
    if type(entry) is not list or len(entry) != len(DeviceReport._fields):
        raise ProtocolError(f"A device report is a list of {len(DeviceReport._fields)} "
                            f"figures ({', '.join(DeviceReport._fields)}).")
    resident, buckets, seconds, replays, registrations, queued, *bulk = entry
    if not all(map(_count, (resident, replays, registrations, queued, *bulk))):
        raise ProtocolError("A device report's sizes and counts must be ints from 0 to 2**63-1.")
    if (type(buckets) is not list or len(buckets) != len(OP_SECONDS_BUCKETS) + 1
            or not all(map(_count, buckets)) or sum(buckets) > _MAX_COUNT):
        raise ProtocolError(f"A device report's op_buckets must be {len(OP_SECONDS_BUCKETS) + 1}"
                            " counts (one per bucket of OP_SECONDS_BUCKETS, and +Inf).")
    if type(seconds) not in (int, float) or not 0 <= seconds < float("inf"):
        raise ProtocolError("A device report's op_seconds must be a finite number >= 0.")
    return DeviceReport(resident, tuple(buckets), float(seconds), replays, registrations, queued,
                        *bulk)


def decode_report(body: dict[str, Any], devices: int) -> WorkerReport | None:
    """The report in a worker's HEARTBEAT body from a worker of ``devices`` devices (None
    when it carries none); ProtocolError, saying what is wrong, for a malformed one."""
    if "report" not in body:
        return None
    report = body["report"]
    if type(report) is not list or len(report) != 5 or type(report[1]) is not list:
        raise ProtocolError("A HEARTBEAT's report is [budget_bytes, [device report, ...], "
                            "link_refusals, links, [session report, ...]]: upgrade the worker "
                            "to the broker's fabric release.")
    budget, entries, link_refusals, links, sessions = report
    if budget is not None and not _count(budget):
        raise ProtocolError("A report's budget_bytes must be an int from 0 to 2**63-1, or nil.")
    if not _count(link_refusals):
        raise ProtocolError("A report's link_refusals must be an int from 0 to 2**63-1.")
    if type(links) is not list or len(links) != len(LinkReport._fields) \
            or not all(map(_count, links)):
        raise ProtocolError(f"A report's links are {len(LinkReport._fields)} counts "
                            f"({', '.join(LinkReport._fields)}), ints from 0 to 2**63-1.")
    if len(entries) != devices:
        raise ProtocolError(f"A report has {len(entries)} device report(s) for a worker that "
                            f"registered {devices} device(s): one per device, in order.")
    if type(sessions) is not list or len(sessions) > MAX_REPORTED_SESSIONS or not all(
            type(entry) is list and len(entry) == len(SessionReport._fields)
            and type(entry[0]) is int and 0 <= entry[0] <= _MAX_SESSION_ID
            and _count(entry[1]) and _count(entry[2]) for entry in sessions):
        raise ProtocolError(f"A report's sessions are at most {MAX_REPORTED_SESSIONS} lists "
                            f"of {len(SessionReport._fields)} ints: a session id (its header's"
                            ", 0 to 2**64-1), and a size and a count from 0 to 2**63-1.")
    return WorkerReport(budget, tuple(map(_device_report, entries)), link_refusals,
                        LinkReport(*links), tuple(SessionReport(*entry) for entry in sessions))


# Header and Message are named tuples, not dataclasses: every message on every hop makes
# them, and a frozen dataclass costs three times as much to build. The hot paths below build
# them with ``tuple.__new__`` (every field given), skipping the named tuple's own ``__new__``,
# a Python function that costs as much again.
_new = tuple.__new__

class Header(NamedTuple):
    """The fixed first frame of every message."""

    kind: Kind
    session: int = 0
    request: int = 0
    version: int = PROTOCOL_VERSION
    flags: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.version, self.kind, self.flags, self.session, self.request)


class Message(NamedTuple):
    """A decoded message: header fields, the msgpack body, and any raw buffers.

    A body is never changed once in a message (the default empty map is shared)."""

    kind: Kind
    session: int = 0
    request: int = 0
    body: dict[str, Any] = {}  # noqa: RUF012 - never mutated, see above
    buffers: Sequence[Any] = ()
    version: int = PROTOCOL_VERSION

    @property
    def header(self) -> Header:
        return Header(self.kind, self.session, self.request, self.version)


# Frames are bytes, bytearray, memoryview or zmq.Frame: all have the buffer protocol and a
# len() in bytes, which struct and msgpack read directly (a Frame's .buffer costs more than
# the unpacking).


def decode_header(frame: Any) -> Header:
    """Parse the header frame; raise ProtocolError for anything that is not one."""
    if len(frame) != HEADER_SIZE:
        raise ProtocolError(
            f"The header frame is {len(frame)} bytes, not {HEADER_SIZE}: "
            "the peer is not speaking the fabric protocol."
        )
    magic, version, kind, flags, session, request = HEADER.unpack(frame)
    if magic != MAGIC:
        raise ProtocolError("The header frame has the wrong magic: the peer is not a fabric peer.")
    member = _KIND_OF.get(kind)
    if member is None:
        raise ProtocolError(f"Unknown message kind {kind}: upgrade the older peer.", kind=kind)
    return _new(Header, (member, session, request, version, flags))


_packers = threading.local()  # msgpack.packb makes a Packer per call, a µs on every message


def pack_body(body: dict[str, Any]) -> bytes:
    """Encode a msgpack body."""
    try:
        packer = _packers.packer
    except AttributeError:  # (a Packer is not shared between threads: it has a buffer)
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(body)


# The schemas as the check runs them (every REQUEST, a read's too, is checked): for each
# kind, (field, types, whether a bool passes; isinstance alone takes a bool for an int).
_FIELD_CHECKS = {
    kind: tuple((name, expected, bool in (expected if isinstance(expected, tuple) else
                                          (expected,)))
                for name, expected in fields.items())
    for kind, fields in BODY_SCHEMAS.items()}


def encode(message: Message) -> list[Any]:
    """Frames for a message: header, msgpack body (unless empty), then the raw buffers as
    they are."""
    body = message.body  # (the header is packed directly: a Header first costs a µs)
    flags = CARRIES_BATCH if "ops" in body and message.kind is Kind.REQUEST else 0
    header = HEADER.pack(MAGIC, message.version, message.kind, flags if body else NO_BODY,
                         message.session, message.request)
    if body:
        return [header, pack_body(body), *message.buffers]
    return [header, *message.buffers]


def check_frames(header: Header, frames: Sequence[Any]) -> None:
    """Raise ProtocolError unless ``frames`` has the body frame its header announces."""
    if len(frames) < 2 and not header.flags & NO_BODY:
        raise ProtocolError(
            f"A message has {len(frames)} frame(s); a header and a body are needed (or the "
            "header's NO_BODY flag)."
        )


def decode(frames: Sequence[Any], header: Header | None = None) -> Message:
    """Decode and validate a full message (after any routing identity was removed);
    ``header`` is its first frame's, when the caller has already read it.

    The body must be one msgpack map, and a control kind's body must have its required
    fields (``BODY_SCHEMAS``); each failure is a ProtocolError naming what is wrong. (All in
    this one function: it runs on every message, where each Python call costs.)"""
    if not frames:
        raise ProtocolError("A message has 0 frame(s); a header and a body are needed.")
    if header is None:
        header = decode_header(frames[0])
    kind = header.kind
    if header.flags & NO_BODY:
        body: dict[str, Any] = {}
        buffers = tuple(frames[1:])
    else:
        if len(frames) < 2:
            check_frames(header, frames)  # (raises)
        limit = CONTROL_BODY_BYTES.get(kind)
        if limit is not None and len(frames[1]) > limit:
            raise ProtocolError(
                f"A {kind.name} body is {len(frames[1])} bytes, more than the {limit} one may "
                "have: fabric's client and worker send far less; shorten what it carries.",
                size=len(frames[1]), limit=limit)
        try:
            body = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many types for bad input; all mean the same
            raise ProtocolError(f"The message body is not valid msgpack ({exc}).") from None
        if type(body) is not dict:
            raise ProtocolError(f"The message body is a {type(body).__name__}, not a map.")
        buffers = tuple(frames[2:])
    if header.version == PROTOCOL_VERSION:  # (another version's bodies may differ)
        for name, expected, bool_passes in _FIELD_CHECKS.get(kind, ()):
            value = body.get(name)
            if not isinstance(value, expected) or not bool_passes and isinstance(value, bool):
                raise ProtocolError(
                    f"{kind.name} body field {name!r} is missing or has the wrong type.",
                    field=name)
        for name in LABEL_FIELDS.get(kind, ()):
            value = body.get(name)
            if type(value) is str and len(value) > MAX_LABEL_CHARS:
                raise ProtocolError(
                    f"{kind.name} body field {name!r} is {len(value)} characters long, more "
                    f"than the {MAX_LABEL_CHARS} a label may have: shorten it.", field=name)
    return _new(Message, (kind, header.session, header.request, body, buffers, header.version))


def with_request(message: Message, request: int) -> Message:
    """``message`` with its request id set to ``request``."""
    return _new(Message, (message.kind, message.session, request, message.body,
                          message.buffers, message.version))


def request_message(session: int, body: dict[str, Any], buffers: Sequence[Any] = ()
                    ) -> Message:
    """A REQUEST of ``session`` (its request id set by ``with_request`` as it is sent), made
    without the NamedTuple's Python ``__new__``: every read makes one."""
    return _new(Message, (Kind.REQUEST, session, 0, body, buffers, PROTOCOL_VERSION))


def reply_to(request: Message, body: dict[str, Any], buffers: tuple[Any, ...] = ()) -> Message:
    """The REPLY to ``request`` (its session and request id) with ``body`` and ``buffers``."""
    return _new(Message, (Kind.REPLY, request.session, request.request, body, buffers,
                          PROTOCOL_VERSION))


def reply_error(request: Message, error: FabricError) -> Message:
    """The REPLY to ``request`` that carries ``error`` (a request's failure, not the
    session's: the session goes on)."""
    return reply_to(request, {"error": error.to_wire()})


def error_message(error: FabricError, *, kind: Kind = Kind.ERROR, session: int = 0,
                  request: int = 0) -> Message:
    """An ERROR (or REJECT) message carrying a typed error."""
    return Message(kind, session, request, error.to_wire())
