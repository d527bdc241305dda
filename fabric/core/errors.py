"""The one hierarchy of errors a fabric user can see, each reachable as ``fabric.X``::

    FabricError
    ├── ConnectError                 the client could not open a session
    │   ├── EncryptionError
    │   ├── WrongPort
    │   ├── NoActiveBroker           none of a pair's brokers serves
    │   └── HandshakeError
    │       ├── ServerDisconnected
    │       ├── HandshakeTimeout
    │       ├── VersionMismatch
    │       ├── AuthenticationError
    │       ├── NoSuchDevice
    │       ├── DeviceOffline
    │       │   └── DeviceDraining
    │       ├── DuplicateSession
    │       ├── TooManySessions
    │       └── BrokerPassive        the other broker of the pair serves
    ├── SessionLost                  an open session ended (its worker, broker or link died)
    │   ├── SessionClosed            its user closed it
    │   └── ResumeRefused            not resumed after a broker takeover (reason)
    ├── MessageTooLarge
    ├── RequestTimeout
    ├── ReplyLost                    a reply lost in a takeover that cannot be given again
    ├── RemoteError                  an op failed on the device
    │   ├── QuotaExceeded
    │   ├── GraphError
    │   └── DtypeNotSupported
    ├── TraceError (also TypeError)
    ├── ProtocolError
    ├── DeviceNotHostable
    │   └── BackendMissing
    ├── WorkerNameTaken
    ├── NotFound
    ├── ConfigError
    └── ClusterError
    RemoteWarning (a RuntimeWarning)  a warning numpy issued on the device

Rule: every error has a stable string ``code`` that also travels on the wire (in REJECT and
ERROR bodies), so a rejection made by the broker or a worker is raised on the client as the
same class, with the same details. Messages are sentences that say what to do, and name a
value a user gave by ``named``: no message ever reads a tensor's values from its device.
"""

from __future__ import annotations

from typing import Any


class FabricError(Exception):
    """Root of every error raised by fabric; ``code`` is stable and travels on the wire."""

    code = "fabric_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        """The body of a REJECT or ERROR message that carries this error."""
        return {"code": self.code, "message": self.message, "details": self.details}


class ConnectError(FabricError):
    """The client could not reach a fabric broker at the address."""

    code = "connect_failed"


class EncryptionError(ConnectError):
    """The encrypted (CURVE) handshake failed: encryption is on at one end only, a key is
    wrong, or the broker does not accept this key. ZeroMQ itself says nothing about it."""

    code = "encryption_failed"


class WrongPort(ConnectError):
    """The address is the broker's port for the other kind of peer: a client or ``fabric
    admin`` at the workers' port, or a worker at the clients' port. The sentence names the
    right port when the broker knows it."""

    code = "wrong_port"


class HandshakeError(ConnectError):
    """The broker was reached but the session could not be opened."""

    code = "handshake_failed"


class BrokerPassive(HandshakeError):
    """This broker is the passive one of a pair (``--peer``): the other broker serves. The
    client (or worker) tries the other address."""

    code = "broker_passive"


class NoActiveBroker(ConnectError):
    """None of the brokers listed for a client serves it: each is passive, unreachable or
    refused it. The sentence names each address and what it said."""

    code = "no_active_broker"


class ServerDisconnected(HandshakeError):
    """The connection closed before the broker answered the HELLO."""

    code = "server_disconnected"


class HandshakeTimeout(HandshakeError):
    """Nothing answered the HELLO before the deadline."""

    code = "handshake_timeout"


class VersionMismatch(HandshakeError):
    """Client and broker speak different protocol versions."""

    code = "version_mismatch"

    @property
    def client_version(self) -> int | None:
        return self.details.get("client_version")

    @property
    def server_version(self) -> int | None:
        return self.details.get("server_version")


class AuthenticationError(HandshakeError):
    """The token was refused."""

    code = "unauthorized"


class NoSuchDevice(HandshakeError):
    """The requested device index does not exist on this cluster."""

    code = "no_such_device"

    @property
    def device_count(self) -> int | None:
        return self.details.get("device_count")


class DeviceOffline(HandshakeError):
    """The device exists but its worker is not connected now."""

    code = "device_offline"


class DeviceDraining(DeviceOffline):
    """The device's worker is being drained by an administrator: it takes no new sessions."""

    code = "device_draining"


class DuplicateSession(HandshakeError):
    """A session with this id is already open on the broker."""

    code = "duplicate_session"


class SessionLost(FabricError):
    """The session ended without being closed: its worker, the broker or the link is gone."""

    code = "session_lost"


class SessionClosed(SessionLost):
    """The session was closed by its user (``close()``, or the end of its ``with`` block):
    open a new one. A ``SessionLost``, so that handlers of a session's end see it too."""

    code = "session_closed"


class ResumeRefused(SessionLost):
    """A session could not be resumed on the broker that took over from its own: its worker
    did not report it (the worker died too, or held it past its grace), or the session id
    came without its secret or token. ``reason`` says which; the session is gone."""

    code = "resume_refused"


class TooManySessions(HandshakeError):
    """A limit on open sessions (per client connection, per client token on a device, or per
    device) refused the HELLO."""

    code = "too_many_sessions"


class MessageTooLarge(FabricError):
    """A message would pass the message-size limit of a socket on its way (MAXMSGSIZE)."""

    code = "message_too_large"


class RequestTimeout(FabricError):
    """A request got no answer before its deadline."""

    code = "timeout"


class ReplyLost(FabricError):
    """The answer to a request was lost with the broker a session was resumed past, and its
    worker could not give it again: the reply was too large to keep (a read of over 4 MiB)
    and the session has run ops since, which may have changed what it read. The session goes
    on: read the tensor again."""

    code = "reply_lost"


class RemoteError(FabricError):
    """An operation failed on the worker; raised at the next read or sync that depends on it."""

    code = "remote_error"


class QuotaExceeded(RemoteError):
    """An op would take the session past the worker's memory limit; the worker goes on."""

    code = "quota_exceeded"


class GraphError(RemoteError):
    """A graph call the worker cannot run: unknown graph, wrong bindings, a freed input."""

    code = "graph_error"


class DtypeNotSupported(RemoteError):
    """An op's operand or result has a dtype its device cannot hold (a jax device has no
    float128): the op is refused, never computed in another precision."""

    code = "dtype_not_supported"


class TraceError(FabricError, TypeError):
    """A traced function did something that needs tensor values (``bool(t)``, ``t.numpy()``)."""

    code = "trace_error"


class ProtocolError(FabricError):
    """A message did not follow the fabric wire protocol."""

    code = "protocol_error"


class DeviceNotHostable(FabricError):
    """A worker was asked to host a device that cannot serve remote sessions."""

    code = "device_not_hostable"


class BackendMissing(DeviceNotHostable):
    """A worker was asked for a backend whose package or hardware this machine lacks (jax
    not installed, no CUDA device): it exits 2 naming what to install."""

    code = "backend_missing"


class WorkerNameTaken(FabricError):
    """A worker registered under the name of a live worker: the newcomer is refused."""

    code = "worker_name_taken"


class NotFound(FabricError):
    """An admin command named a session or worker the broker does not have."""

    code = "not_found"


class ConfigError(FabricError):
    """A token or key file is missing, empty or too widely readable."""

    code = "config_error"


class ClusterError(FabricError):
    """A process of a local cluster failed to start."""

    code = "cluster_error"


class RemoteWarning(RuntimeWarning):
    """numpy warned on the device (divide by zero, overflow, invalid value): issued through
    Python's ``warnings`` at the next read or sync, at the line of user code that issued the
    op, with numpy's message. Not an error: it has no code, and ``warnings`` filters decide
    what becomes of it (``"error"`` raises it at that read)."""


def _all_subclasses(cls: type[FabricError]) -> list[type[FabricError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found


ERRORS_BY_CODE: dict[str, type[FabricError]] = {c.code: c for c in _all_subclasses(FabricError)}


def named(value: Any) -> str:
    """``value`` as a message names it: its ``repr``, but a tensor (``fabric.Tensor``, a
    sharded one: whatever has a ``_handle``) by its handle (shape, dtype, session, device),
    where its ``repr`` would read its values from the device."""
    handle = getattr(type(value), "_handle", None)
    return handle(value) if handle is not None else repr(value)


def error_from_wire(body: dict[str, Any]) -> FabricError:
    """Rebuild the typed error carried by a REJECT or ERROR body (unknown codes stay generic)."""
    cls = ERRORS_BY_CODE.get(str(body.get("code")), FabricError)
    details = body.get("details")
    error = cls(str(body.get("message", "")))
    # Assigned, not passed as keywords: a peer's details may hold non-string keys or "message".
    error.details = dict(details) if isinstance(details, dict) else {}
    if cls is FabricError:
        error.code = str(body.get("code"))
    return error
