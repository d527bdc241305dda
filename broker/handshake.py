"""The broker's admission checks: who may open a session, and what a peer says it takes.

Rule: every check here runs before any state is created and changes nothing; it returns the
refusal (a ``FabricError`` with its code and a sentence saying what to do) or None. Tokens are
compared in constant time. The checks on HELLO, in order: protocol version (before the body,
which another version may lay out differently), client token, device index, device online,
worker not draining, duplicate session id, and the session limits (per client connection,
per device). The registry answers a refused token late (``Limits.auth_delay``).
"""

from __future__ import annotations

import hmac
from typing import Any

from fabric.errors import (
    DeviceDraining,
    DeviceOffline,
    DuplicateSession,
    FabricError,
    NoSuchDevice,
    TooManySessions,
    VersionMismatch,
)
from fabric.protocol import PROTOCOL_VERSION, Message

from .model import Limits
from .sessions import SessionTable
from .worker_table import WorkerTable


def token_ok(offered: Any, expected: bytes | None) -> bool:
    """Whether ``offered`` is the expected token (constant-time; no token set: never)."""
    if expected is None or not isinstance(offered, str):
        return False
    return hmac.compare_digest(offered.encode(), expected)


def version_mismatch(peer: str, version: int) -> VersionMismatch:
    """The refusal of a ``peer`` ("client" or "worker") that speaks another version."""
    return VersionMismatch(
        f"The {peer} speaks protocol version {version} and this broker speaks "
        f"{PROTOCOL_VERSION}: install matching fabric versions.",
        client_version=version, server_version=PROTOCOL_VERSION)


def size_limit(body: dict[str, Any], default: int) -> int:
    """A peer's ``max_message_bytes`` (optional in HELLO and REGISTER), capped by ours."""
    value = body.get("max_message_bytes")
    if type(value) is int and value > 0:
        return min(value, default)
    return default


def hello_refusal(identity: bytes, message: Message, workers: WorkerTable,
                  sessions: SessionTable, limits: Limits) -> FabricError | None:
    """Why a HELLO with a valid token cannot open a session now, or None."""
    device = message.body["device"]
    if not 0 <= device < workers.device_count:
        return NoSuchDevice(
            f"Device {device} does not exist: this cluster has {workers.device_count} "
            f"device(s), numbered from 0; list them with fabric.devices().",
            device=device, device_count=workers.device_count)
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
    return _session_limit(identity, device, owner, sessions, limits)


def _session_limit(identity: bytes, device: int, owner: tuple[bytes, int],
                   sessions: SessionTable, limits: Limits) -> TooManySessions | None:
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
    return None
