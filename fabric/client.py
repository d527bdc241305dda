"""The client: a connection to a broker, and sessions bound to one device each.

Rule: a ``Connection`` owns one DEALER socket and its monitor and is used only from the
thread that made it; every wait on it has a deadline. During the handshake the socket
monitor turns "nothing listening", "closed before WELCOME" and "not a ZeroMQ peer" into
typed errors at once instead of waiting for the timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import zmq

from . import protocol
from .errors import (
    ConnectError,
    FabricError,
    HandshakeError,
    HandshakeTimeout,
    MessageTooLarge,
    RequestTimeout,
    ServerDisconnected,
    SessionLost,
    VersionMismatch,
    error_from_wire,
)
from .config import CONNECTION_FILE_ENV, load_connection_file
from .flow import (CLIENT_HEARTBEAT_MS, CLIENT_HEARTBEAT_TIMEOUT_MS, DEFAULT_MAX_MESSAGE_BYTES,
                   size_text)
from .pending import PendingTable
from .protocol import PROTOCOL_VERSION, Kind, Message
from .security import CurveClient, CurveOption, client_keys, handshake_error
from .sockets import (NOBLOCK, POLLIN, message_check, recv_frames, recv_monitor_event, send_frames,
                      try_send)
from .tensor import Tensor, TensorSession

# How long libzmq may take for its own greeting: a peer that accepts TCP but never speaks
# ZeroMQ (an HTTP server, say) is found out this fast rather than at the full timeout.
ZMTP_HANDSHAKE_LIMIT = 1.5
# Messages queued towards the broker before ``send`` waits: this, with the op batch limits,
# bounds the client's memory for unsent work (backpressure instead of growth).
SEND_QUEUE = 64
_WATCHED_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)


@dataclass(frozen=True)
class Device:
    """A device of the cluster: its global index, the worker that owns it, what it is."""

    index: int
    worker: str
    backend: str
    settings: dict[str, Any]
    local: int = 0

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> "Device":
        return cls(int(body["index"]), str(body["worker"]), str(body["backend"]),
                   dict(body.get("settings", {})), int(body.get("local", 0)))


def resolve_token(token: str | None) -> str:
    """The token given, else ``FABRIC_TOKEN``; a clear error when there is neither."""
    token = token if token is not None else os.environ.get("FABRIC_TOKEN")
    if not token:
        raise ConnectError("No token given: pass token=..., or set FABRIC_TOKEN.")
    return token


class Connection:
    """One DEALER connection to a broker's frontend, used by the thread that made it."""

    def __init__(self, address: str, *, handshake_limit: float = ZMTP_HANDSHAKE_LIMIT,
                 curve: CurveClient | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.address = address
        self.curve = curve  # CURVE keys: the connection is encrypted, the broker checks them
        self.pending = PendingTable()
        self._thread = threading.get_ident()
        self._context = zmq.Context.instance()
        self.socket = self._context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_limit * 1000))
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, CLIENT_HEARTBEAT_MS)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, CLIENT_HEARTBEAT_TIMEOUT_MS)
        self.socket.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        # The largest frame this socket takes; the broker keeps replies within it (HELLO).
        self.max_message_bytes = max_message_bytes
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.set_send_timeout(10.0)
        if curve is not None:
            curve.apply(self.socket)
        self._monitor = self.socket.get_monitor_socket(_WATCHED_EVENTS)
        # What a wait polls, for zmq.zmq_poll itself (a Poller adds a Python call per wait).
        self._poll_items = [(self.socket, POLLIN), (self._monitor, POLLIN)]
        self._message_waits = message_check(self.socket)
        self.established = False  # set once a reply proves a fabric broker is there
        self.users = 0  # sessions open over this connection
        self.closed = False
        self.error: FabricError | None = None  # why the connection is unusable, if it is
        try:
            self.socket.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise ConnectError(f"Cannot connect to {address!r}: {exc}. Use an address like "
                               "tcp://host:port or ipc:///path.") from None

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise FabricError("A fabric session is used only by the thread that connected it: "
                              "call fabric.connect() in each thread that issues ops.")

    def set_send_timeout(self, seconds: float) -> None:
        """How long ``send`` may wait for room in the queue to the broker."""
        self.send_timeout = seconds
        self.socket.setsockopt(zmq.SNDTIMEO, int(seconds * 1000))

    def send(self, message: Message) -> None:
        """Queue a message to the broker (no reply expected)."""
        self._send(message)
        # Read what has come meanwhile: a client that only streams ops still reads, so the
        # broker never holds messages for it (it cuts off clients that leave them unread).
        self._drain()

    def _send(self, message: Message) -> None:
        """Queue a message, or raise why the connection or its session cannot take it."""
        if threading.get_ident() != self._thread:  # (every message: the call only to raise)
            self._check_thread()
        if self.error is not None:
            raise self.error
        if message.session in self.pending.lost:  # known lost: fail now, send nothing
            raise self.pending.lost[message.session]
        try:
            send_frames(self.socket, protocol.encode(message))
        except zmq.Again:
            raise RequestTimeout(
                f"The broker at {self.address} took none of the {SEND_QUEUE} queued messages "
                f"in {self.send_timeout:g} s: it or the device's worker is overloaded or gone."
            ) from None

    def request(self, message: Message, timeout: float, *, session: int = 0) -> Message:
        """Send a request and wait for its reply (matched by request id) until the deadline."""
        request = self.pending.new_request()
        try:
            # Unlike ``send``, no read right after: the wait reads everything that has come.
            self._send(protocol.with_request(message, request))
            reply = self._wait_for(partial(self.pending.take, request),
                                   time.monotonic() + timeout, session, self._timeout_error)
        except BaseException:
            self.pending.forget(request)
            raise
        if (session in self.pending.lost and reply.kind == Kind.ERROR
                and reply.body.get("code") == SessionLost.code):
            # The broker's earlier notice says why the session ended; this answer only says
            # it is gone.
            raise self.pending.lost[session]
        return reply

    def wait_for_credit(self, session: int, done: int, deadline: float,
                        timeout_error: Callable[[float], FabricError]) -> None:
        """Wait until the device has run ``done`` of ``session``'s SUBMITs (its CREDIT)."""
        self._check_thread()
        self._wait_for(lambda: self.pending.done.get(session, 0) >= done or None, deadline,
                       session, timeout_error)

    def _wait_for(self, ready: Callable[[], Any], deadline: float, session: int,
                  timeout_error: Callable[[float], FabricError]) -> Any:
        """Read messages until ``ready()`` is not None, and return it; raise the typed
        error if the session or the connection is lost, or the deadline passes, first
        (the caller checked the thread)."""
        while True:
            result = ready()
            if result is not None:
                return result
            if session in self.pending.lost:
                raise self.pending.lost[session]
            if self.error is not None:
                raise self.error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error(deadline)
            for sock, _ in zmq.zmq_poll(self._poll_items, int(remaining * 1000)):
                if sock is self._monitor:
                    self._on_event(recv_monitor_event(self._monitor))
                else:  # one message (the poll saw it come: no check first);
                    self._receive()  # more that came are read as the loop goes on

    def _timeout_error(self, deadline: float) -> FabricError:
        if not self.established:
            return HandshakeTimeout(
                f"No answer from {self.address} before the deadline: the broker may be "
                "overloaded, or the address belongs to another ZeroMQ service. Check the "
                "address, or raise timeout=."
                + (" With CURVE on, also check the keys: ZeroMQ does not always say when "
                   "they do not match." if self.curve is not None else ""))
        return RequestTimeout(f"The broker at {self.address} did not answer in time: check "
                              "that it and the device's worker are running, or raise timeout=.")

    def _drain(self) -> None:
        """Read and file every message that has come."""
        while self._message_waits():
            self._receive()

    def _receive(self) -> None:
        """Read and file one message if one has come; never wait for it."""
        try:
            frames = recv_frames(self.socket, NOBLOCK)  # (a wait here has no deadline)
        except zmq.Again:
            return
        message = protocol.decode(frames)
        self.established = True
        self.pending.on_message(message)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED or kind == zmq.EVENT_CONNECTED:
            return
        if self.established:
            if kind == zmq.EVENT_DISCONNECTED:
                self.error = SessionLost(
                    f"The connection to the broker at {self.address} was lost: its sessions "
                    "are gone. Open a new session once the broker is back.")
            return
        security = handshake_error(kind, event["value"], self.address,
                                   encrypted=self.curve is not None)
        if security is not None:  # ZeroMQ is silent about these but for this event
            self.error = security
        elif kind == zmq.EVENT_CONNECT_RETRIED:
            self.error = ConnectError(
                f"Nothing is listening at {self.address}: start a broker there "
                "(fabric broker --frontend ...) or check the address.")
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            self.error = ConnectError(
                f"The peer at {self.address} is not a fabric broker (it broke the ZeroMQ "
                "handshake): check the address and port.")
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and event["value"] == errno.EAGAIN:
            self.error = ConnectError(
                f"The peer at {self.address} did not complete a ZeroMQ handshake: it is not a "
                "fabric broker (an HTTP server?). Check the address and port.")
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED):
            self.error = ServerDisconnected(
                f"Server disconnected during initialization: {self.address} closed the "
                "connection before the broker answered. Check that the address is a fabric "
                "broker's frontend and read the broker's log.")

    def close(self, linger: float = 0.0) -> None:
        """Close the socket and its monitor; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self.socket.close(linger=int(linger * 1000))


def _check_version(reply: Message) -> None:
    if reply.version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"The broker speaks protocol version {reply.version} and this client speaks "
            f"{PROTOCOL_VERSION}: install matching fabric versions.",
            client_version=PROTOCOL_VERSION, server_version=reply.version)


def expect_reply(reply: Message, expected: Kind) -> Message:
    """The reply if it is of the ``expected`` kind; the typed error it carries otherwise."""
    if reply.kind is expected and reply.version == PROTOCOL_VERSION:
        return reply  # (every read's answer: the commonest case is tested first)
    _check_version(reply)
    if reply.kind in (Kind.REJECT, Kind.ERROR):
        raise error_from_wire(reply.body)
    if reply.kind != expected:
        raise ConnectError(f"The peer answered with {reply.kind.name}, not {expected.name}: "
                           "it is not a fabric broker's frontend.")
    return reply


class Session(TensorSession):
    """A session bound to one device; use as a context manager or call ``close()``.

    Arrays live on the device: create them with ``asarray``, ``zeros``, ``ones``, ``full``,
    ``empty``, ``arange``, ``linspace``, ``eye`` or ``random``; ops on them are streamed.
    """

    def __init__(self, connection: Connection, session_id: int, welcome: Message,
                 timeout: float, token: str) -> None:
        self.connection = connection
        connection.users += 1
        self._token = token
        self.id = session_id
        self.timeout = timeout
        self.device = Device.from_wire(welcome.body["device"])
        self.device_count: int = welcome.body["device_count"]
        self.server: str = welcome.body["server"]
        # The largest array this session may upload in one piece: every socket on the way
        # to its device takes it (an oversized frame would silently cost the connection).
        limit = welcome.body.get("max_message_bytes")
        self.max_upload_bytes: int = (limit if type(limit) is int and limit > 0
                                      else connection.max_message_bytes)
        self.closed = False
        self.on_close: Callable[[], None] | None = None  # set by whoever owns the cluster
        connection.set_send_timeout(timeout)
        self._init_stream()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"<fabric.Session {self.id:#x} {state} on device {self.device.index} "
                f"({self.device.backend}, worker {self.device.worker})>")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _upload(self, array: np.ndarray) -> Tensor:
        if array.nbytes > self.max_upload_bytes:
            raise MessageTooLarge(
                f"The array is {size_text(array.nbytes)}, more than the "
                f"{size_text(self.max_upload_bytes)} one message to device "
                f"{self.device.index} may carry: upload it in slices and join them on "
                "the device with np.concatenate, or raise --max-message-bytes on the "
                "broker and workers.", size=array.nbytes, limit=self.max_upload_bytes)
        return super()._upload(array)

    def open(self, device: int, timeout: float | None = None) -> "Session":
        """Another session, on ``device``, over this session's connection (one connection
        serves sessions on any number of devices; it closes with its last session)."""
        self._check_open()
        return _open_session(self.connection, self._token, device,
                             self.timeout if timeout is None else timeout)

    def _check_open(self) -> None:
        """Raise why this session cannot be used here: it is closed, or this is not its
        thread."""
        if self.closed:
            raise SessionLost(f"Session {self.id:#x} is closed: open a new session.")
        self.connection._check_thread()

    def _request(self, body: dict[str, Any], timeout: float | None = None) -> Message:
        if self.closed:  # (every read: the call only to raise)
            self._check_open()
        reply = self.connection.request(Message(Kind.REQUEST, self.id, 0, body),
                                        self.timeout if timeout is None else timeout,
                                        session=self.id)
        return expect_reply(reply, Kind.REPLY)

    def close(self, timeout: float | None = None) -> None:
        """Close the session and free everything it holds on the device (idempotent)."""
        if self.closed:
            return
        self._batch, self._buffers = [], []  # closing frees it all
        self.closed = True
        self._thread = None  # every later op stops at _check_open
        try:
            if self.connection.error is None and self.id not in self.connection.pending.lost:
                reply = self.connection.request(Message(Kind.CLOSE, self.id),
                                                self.timeout if timeout is None else timeout,
                                                session=self.id)
                _check_version(reply)
        except SessionLost:
            pass  # already gone on the broker: nothing left to free
        finally:
            self.connection.pending.done.pop(self.id, None)  # (its CREDITs came before CLOSED)
            self.connection.users -= 1
            if not self.connection.users:
                self.connection.close()
            if self.on_close is not None:
                self.on_close()


def _target(address: str | None, token: str | None, connection_file: str | None,
            curve: CurveOption = None,
            ) -> tuple[str, str, str | None, CurveClient | None] | None:
    """The address, token, connection file (if one was used) and CURVE keys from the
    arguments or the environment; None when nothing names a cluster (the embedded one)."""
    if address is None and (connection_file or os.environ.get(CONNECTION_FILE_ENV)):
        info = load_connection_file(connection_file)
        return (info["address"], token or info["token"], info["path"],
                client_keys(curve if curve is not None else info.get("curve")))
    if address is None:
        return None
    return address, resolve_token(token), None, client_keys(curve)


@contextlib.contextmanager
def naming_connection_file(connection_file: str | None) -> Iterator[None]:
    """Name the connection file in a connect error: it may be stale (a refusal by a broker
    that answered says nothing about staleness, so it is left alone)."""
    try:
        yield
    except ConnectError as exc:
        answered = isinstance(exc, HandshakeError) and not isinstance(exc, (
            ServerDisconnected, HandshakeTimeout))
        if connection_file is not None and not answered:
            exc.args = (f"{exc.message} (The address came from {connection_file}: it may be "
                        "stale; is fabric cluster up still running?)",)
        raise


def connect(address: str | None = None, *, token: str | None = None, device: int = 0,
            timeout: float = 10.0, connection_file: str | None = None,
            curve: CurveOption = None,
            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Session:
    """Open a session on ``device`` of the broker at ``address``.

    With no address, the address and token come from ``connection_file`` (or the file named
    by $FABRIC_CONNECTION_FILE, as written by ``fabric cluster up``); with neither, an
    embedded local cluster is started for this process and stopped when its last session
    closes or the interpreter exits.

    Fails fast with a typed error: ``ConnectError`` when nothing listens there or the peer
    is not a fabric broker, ``ServerDisconnected`` when it closes before answering,
    ``VersionMismatch``, ``AuthenticationError``, ``NoSuchDevice`` or another
    ``HandshakeError`` when the broker refuses, ``HandshakeTimeout`` at ``timeout``.

    ``curve`` encrypts the connection (CURVE): a ``fabric.CurveClient``, a directory written
    by ``fabric keys generate`` (its client pair and broker.key), or a mapping with
    ``secret_key_file`` and ``server_public_key_file``; a connection file may name them too.
    A key the broker refuses, or encryption on at one end only, is an ``EncryptionError``.

    ``max_message_bytes`` is the largest frame (one array) the connection takes; the broker
    keeps reads within it, and uploads within what it and the device's worker take, so an
    array too big is a ``MessageTooLarge`` at the call instead of a lost connection.
    """
    target = _target(address, token, connection_file, curve)
    if target is None:
        from .cluster import embedded_session  # the cluster module imports this one

        if curve is not None:
            raise ConnectError("curve= needs an address or a connection file: the embedded "
                               "local cluster is not encrypted.")
        return embedded_session(device, timeout)
    address, token, source, keys = target
    connection = Connection(address, handshake_limit=min(timeout, ZMTP_HANDSHAKE_LIMIT),
                            curve=keys, max_message_bytes=max_message_bytes)
    with naming_connection_file(source):
        return _open_session(connection, token, device, timeout)


def _open_session(connection: Connection, token: str, device: int, timeout: float) -> Session:
    """HELLO on ``connection``; the session, or the typed error (closing an unused
    connection)."""
    session_id = secrets.randbits(64) or 1
    hello = Message(Kind.HELLO, session_id, body={
        "token": token, "device": device, "client": f"pid {os.getpid()}",
        "max_message_bytes": connection.max_message_bytes})
    try:
        welcome = expect_reply(connection.request(hello, timeout), Kind.WELCOME)
    except HandshakeTimeout:
        # A slow broker may still open it: ask it to drop the session, best effort (a full
        # queue skips it: the timeout is what the caller hears of).
        try_send(connection.socket, protocol.encode(Message(Kind.CLOSE, session_id)))
        if not connection.users:
            connection.close(linger=0.2)
        raise
    except BaseException:
        if not connection.users:
            connection.close()
        raise
    return Session(connection, session_id, welcome, timeout, token)


def devices(address: str | None = None, *, token: str | None = None, timeout: float = 10.0,
            connection_file: str | None = None, curve: CurveOption = None) -> list[Device]:
    """Every device of every worker registered with the broker at ``address`` (or the one a
    connection file names); ``curve`` as for ``connect``."""
    target = _target(address, token, connection_file, curve)
    if target is None:
        raise ConnectError("No address given: pass one, or a connection_file, or set "
                           f"{CONNECTION_FILE_ENV}.")
    address, token, source, keys = target
    connection = Connection(address, handshake_limit=min(timeout, ZMTP_HANDSHAKE_LIMIT),
                            curve=keys)
    try:
        with naming_connection_file(source):
            reply = connection.request(Message(Kind.DEVICES, body={"token": token}), timeout)
        return [Device.from_wire(d) for d in expect_reply(reply, Kind.DEVICE_LIST).body["devices"]]
    finally:
        connection.close()
