"""The broker's admission checks: who may connect, who may open a session, and what a peer
says it takes.

Rule: every check here runs before any state is created and changes nothing; it returns the
refusal (a ``FabricError`` with its code and a sentence saying what to do), or the role, or
None. Tokens are compared in constant time.

First gate, in the ZeroMQ handshake (``handshake_role``, asked through ZAP): a peer without a
token (or, with CURVE, an allowed key) is refused before its connection is attached to the
socket, so nothing it sends, its routing id included, ever reaches libzmq's routing table or
the broker (libzmq 4.3.5 aborts the process when a peer-chosen routing id collides with one it
numbers itself). Second gate, in the protocol: the checks on HELLO, in order: protocol version
(before the body, which another version may lay out differently), client token, device index,
device online, worker not draining, duplicate session id, and the session limits (per client
connection, per device, per client token on the device: a full device is named as such). The
registry answers a refused token late (``Limits.auth_delay``), at either gate.

A message a port does not take from its sender is answered by ``misplaced``: a peer whose
first message belongs to the other port (a client's HELLO, DEVICES or ADMIN on the workers'
port, a worker's REGISTER or HEARTBEAT on the clients') gets ``WrongPort``, naming the port
it reached and the right one.

A broker may hold several client tokens (one per user or team): a session is counted against
the token that opened it, so one token's holders cannot take every slot of a device from
the others. Clients that share one token share its cap.
"""

from __future__ import annotations

import hmac
from typing import Any, Mapping, Sequence

from zmq import ZMQError
from zmq.utils import z85

from fabric.core.errors import (
    DeviceDraining,
    DeviceOffline,
    DuplicateSession,
    FabricError,
    NoSuchDevice,
    ProtocolError,
    TooManySessions,
    VersionMismatch,
    WrongPort,
)
from fabric.core.protocol import PROTOCOL_VERSION, Kind, Message
from fabric.core.security import PAIR_DOMAIN, WORKERS_DOMAIN
from fabric.core.version import __version__

from .model import Limits, Side
from .sessions import SessionTable
from .worker_table import WorkerTable


def token_index(offered: Any, tokens: Sequence[bytes]) -> int | None:
    """Which of ``tokens`` ``offered`` (text, or bytes from the ZeroMQ handshake) is, or None.
    Every token is compared, each in constant time, so the time taken says nothing of which
    one, or how much, matched."""
    if isinstance(offered, str):
        offered_bytes = offered.encode()
    elif isinstance(offered, bytes):
        offered_bytes = offered
    else:
        return None
    found = None
    for index, token in enumerate(tokens):
        if hmac.compare_digest(offered_bytes, token):
            found = index
    return found


def token_ok(offered: Any, expected: bytes | None) -> bool:
    """Whether ``offered`` is the expected token (constant-time; no token set: never)."""
    return expected is not None and token_index(offered, (expected,)) is not None


def handshake_role(domain: str, mechanism: str, credentials: Sequence[bytes],
                   tokens: Mapping[str, Sequence[bytes]],
                   curve_keys: Mapping[str, frozenset[bytes]] | None) -> str | None:
    """Who a peer connecting to the socket of ZAP ``domain`` is ("client", "admin",
    "worker"), or None to refuse it before its connection is attached (nothing it sends
    reaches the broker). ``mechanism`` and ``credentials`` are what ZAP reports of it.

    Without CURVE the password of the PLAIN mechanism is a token, any of the broker's on
    either socket (a client at the workers' port is told so in the protocol, by role);
    with CURVE (``curve_keys``: the allow-list of each socket's ZAP domain) the peer's
    public key must be in its socket's list, and its token is checked in HELLO or REGISTER.
    The pair's state socket (``PAIR_DOMAIN``) admits only the other broker: the worker token
    (the pair shares it), or with CURVE the pair's own key.
    """
    if domain == PAIR_DOMAIN:
        tokens = {"worker": tokens.get("worker", ())}
    if curve_keys is not None:
        allowed = curve_keys.get(domain, frozenset())
        if (mechanism == "CURVE" and len(credentials) == 1 and len(credentials[0]) == 32
                and z85.encode(credentials[0]) in allowed):
            return "worker" if domain == WORKERS_DOMAIN else "client"
        return None
    if mechanism != "PLAIN" or len(credentials) != 2:
        return None
    found = None
    for role, role_tokens in tokens.items():  # every role compared: constant time
        if token_index(credentials[1], role_tokens) is not None:
            found = role
    return found


def release_mismatch(body: dict[str, Any]) -> VersionMismatch | None:
    """The refusal of a REGISTER from a worker of another fabric release than this broker's
    (``fabric_version``; a worker that does not say is judged by its protocol version alone):
    hosts that drift apart fail at once, naming both, instead of in subtle ways later."""
    theirs = body.get("fabric_version")
    if not isinstance(theirs, str) or theirs == __version__:
        return None
    return VersionMismatch(
        f"The worker runs fabric {theirs[:40]} and this broker fabric {__version__}: install "
        f"the same release on every host (pip install fabric-arrays=={__version__}).",
        worker_fabric_version=theirs[:40], broker_fabric_version=__version__)


def peer_address(frame: Any) -> str:
    """The sender's address as ZeroMQ saw it: a received frame's ``Peer-Address`` ('' for
    transports without one, and for frames given as bytes)."""
    get = getattr(frame, "get", None)  # (a zmq.Frame's properties)
    try:
        return str(get("Peer-Address")) if get is not None else ""
    except ZMQError:
        return ""


def reported_host(body: dict[str, Any]) -> str:
    """The host name a REGISTER says its worker runs on ('' if it says none, or nonsense)."""
    host = body.get("host")
    return host if isinstance(host, str) and 0 < len(host) <= 255 else ""


def other_version(side: Side, message: Message) -> ProtocolError:
    """The error for a non-handshake control message in another protocol version (its body
    unvalidated)."""
    peer = "client" if side is Side.FRONTEND else "worker"
    return ProtocolError(f"Protocol version {message.version} is not {PROTOCOL_VERSION}: "
                         "install matching fabric versions.",
                         **{f"{peer}_version": message.version},
                         server_version=PROTOCOL_VERSION)


def version_mismatch(peer: str, version: int) -> VersionMismatch:
    """The refusal of a ``peer`` ("client" or "worker") that speaks another version."""
    return VersionMismatch(
        f"The {peer} speaks protocol version {version} and this broker speaks "
        f"{PROTOCOL_VERSION}: install matching fabric versions.",
        client_version=version, server_version=PROTOCOL_VERSION)


# The messages that open a client's conversation and a worker's: one that reaches the other
# kind of peer's port comes from a peer given the wrong address, and is told so.
CLIENT_OPENINGS = frozenset({Kind.HELLO, Kind.DEVICES, Kind.ADMIN})
WORKER_OPENINGS = frozenset({Kind.REGISTER, Kind.HEARTBEAT})


def misplaced(reached: Side, kind: Kind, endpoints: dict[str, str]) -> FabricError:
    """The answer to a message of ``kind`` that the port it ``reached`` does not take from
    its sender (any but REGISTER from a stranger on the workers' port; a worker's kind on the
    clients' port): ``WrongPort`` naming the right port (its bound address when
    ``endpoints`` has it) for the first message of the other kind of peer, else a
    ``ProtocolError``."""
    if reached is Side.WORKERS:
        if kind not in CLIENT_OPENINGS:
            return ProtocolError("This worker is not registered: send REGISTER first.",
                                 reason="not_registered")
        bound = endpoints.get("frontend")
        return WrongPort(
            "This is the broker's port for workers (fabric broker --worker-address), not for "
            "clients: connect fabric.connect and fabric admin to its client port"
            f"{f', bound at {bound}' if bound else ''} (fabric broker --frontend).",
            port="workers", client_port=bound)
    if kind not in WORKER_OPENINGS:
        return ProtocolError(f"A {kind.name} message is not accepted from a client.")
    bound = endpoints.get("workers")
    return WrongPort(
        "This worker reached the broker's client port (fabric broker --frontend): start it "
        f"with --broker set to the broker's port for workers"
        f"{f', bound at {bound}' if bound else ''} (fabric broker --worker-address).",
        port="clients", worker_port=bound)


def size_limit(body: dict[str, Any], default: int) -> int:
    """A peer's ``max_message_bytes`` (optional in HELLO and REGISTER), capped by ours."""
    value = body.get("max_message_bytes")
    if type(value) is int and value > 0:
        return min(value, default)
    return default


def hello_refusal(identity: bytes, token: int, message: Message, workers: WorkerTable,
                  sessions: SessionTable, limits: Limits,
                  per_token: int) -> FabricError | None:
    """Why a HELLO with valid client token number ``token`` cannot open a session now, or
    None; ``per_token`` is the sessions one token may hold on one device."""
    device = message.body["device"]
    if not 0 <= device < workers.device_count:
        return NoSuchDevice(
            f"Device {device} does not exist: this cluster has {workers.device_count} "
            f"device(s), numbered from 0; list them with fabric.devices().",
            device=device, device_count=workers.device_count)
    if device not in workers.device_slots:
        return NoSuchDevice(
            f"Device {device} was retired: an administrator forgot its worker (fabric admin "
            "forget), and its index is never given again. Choose another device from "
            "fabric.devices().", device=device, device_count=workers.device_count)
    owner = workers.owner(device)
    if owner is None:
        return DeviceOffline(
            f"Device {device} is offline: its worker is not connected. Retry when it "
            "is back, or choose another device from fabric.devices().", device=device)
    worker = workers.workers[owner[0]]
    if worker.draining:
        return DeviceDraining(
            f"Device {device} is draining: an administrator stopped its worker {worker.name} "
            "from taking new sessions. Choose another device from fabric.devices().",
            device=device, worker=worker.name)
    if message.session == 0 or message.session in sessions.sessions:
        return DuplicateSession(
            f"Session id {message.session:#x} is already in use (or zero): "
            "let the client choose a fresh random id.", session=message.session)
    return _session_limit(identity, token, device, owner, sessions, limits, per_token)


def _session_limit(identity: bytes, token: int, device: int, owner: tuple[bytes, int],
                   sessions: SessionTable, limits: Limits,
                   per_token: int) -> TooManySessions | None:
    """The refusal when a new session would pass a session limit, else None."""
    held = sessions.count_of_client(identity)
    if held >= limits.max_sessions_per_client:
        return TooManySessions(
            f"This client connection already has {held} sessions on this broker, the "
            f"most it allows (--max-sessions-per-client {limits.max_sessions_per_client})"
            ": close the sessions you no longer need, or ask the operator to raise the "
            "limit.", reason="per_client", limit=limits.max_sessions_per_client)
    held = sessions.count_on_device(*owner)
    if held >= limits.max_sessions_per_device:
        return TooManySessions(
            f"Device {device} already serves {held} sessions, the most it allows "
            f"(--max-sessions-per-device {limits.max_sessions_per_device}): close idle "
            "sessions, choose another device from fabric.devices(), or ask the operator "
            "to raise the limit.", reason="per_device", device=device,
            limit=limits.max_sessions_per_device)
    held = sessions.count_of_token(token, *owner)
    if held >= per_token:
        return TooManySessions(
            f"Sessions opened with your client token already hold {held} of device "
            f"{device}'s slots, the most one token may hold there (--max-sessions-per-token "
            f"{per_token}; every client given this token counts): close sessions you no "
            "longer need, choose another device from fabric.devices(), or ask the operator "
            "for a token of your own or a higher limit.", reason="per_token", device=device,
            limit=per_token)
    return None
