"""A connection to a broker's frontend: one DEALER socket, its monitor, and its requests.

Rule: a ``Connection`` owns one DEALER socket and its monitor and is used only from the
thread that made it; every wait on it has a deadline. During the handshake the socket
monitor turns "nothing listening", "closed before WELCOME" and "not a ZeroMQ peer" into
typed errors at once instead of waiting for the timeout. Sessions and admins share it.
Whether the connection and each session it carries may still be used is their lives' to say
(``fabric.core.session_life``): the monitor loses the connection, the pending table a session.
A connection to a broker pair (``brokers``) that loses its broker after the handshake does
not lose its sessions: the wait that saw it resumes them on the other broker and sends again
what had no answer (``fabric.transport.takeover``), with the deadline moved on by as long.
"""

from __future__ import annotations

import contextlib
import errno
import math
import threading
import time
from typing import Any, Callable, Iterator

import zmq

from fabric.core import protocol
from fabric.core.addresses import host_not_resolving
from fabric.core.device import Device
from fabric.core.errors import (
    ConnectError,
    FabricError,
    HandshakeError,
    HandshakeTimeout,
    RequestTimeout,
    ServerDisconnected,
    SessionLost,
    VersionMismatch,
    error_from_wire,
)
from fabric.core.flow import (CLIENT_HEARTBEAT_MS, CLIENT_HEARTBEAT_TIMEOUT_MS,
                              DEFAULT_MAX_MESSAGE_BYTES)
from fabric.core.protocol import PROTOCOL_VERSION, Kind, Message
from fabric.core.security import CurveClient, handshake_error, present_token
from fabric.core.session_life import CLOSED, ONE_THREAD, ConnectionLife
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import SharedMemory
from fabric.core.sockets import (
    NOBLOCK,
    POLLIN,
    message_check,
    new_routing_id,
    recv_frames,
    recv_monitor_event,
    send_frames,
)
from fabric.transport import takeover
from fabric.transport.pending import PendingTable
from fabric.transport.unanswered import Unanswered

# How long libzmq may take for its own greeting: a peer that accepts TCP but never speaks
# ZeroMQ (an HTTP server, say) is found out this fast rather than at the full timeout.
ZMTP_HANDSHAKE_LIMIT = 1.5
# Messages queued towards the broker before ``send`` waits: this, with the op batch limits,
# bounds the client's memory for unsent work (backpressure instead of growth).
SEND_QUEUE = 64
_ERROR = Kind.ERROR  # (a look-up of an enum's member costs a tenth of a microsecond: every read)
_WATCHED_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)



class Connection:
    """One DEALER connection to a broker's frontend, used by the thread that made it."""

    def __init__(self, address: str, token: str | None, *, role: str = "client",
                 handshake_limit: float = ZMTP_HANDSHAKE_LIMIT, curve: CurveClient | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 shared_memory: SharedMemory | None = None, brokers: list[str] = ()) -> None:
        self.address = address
        self.token = token
        # A pair's brokers (this one among them), for a takeover: each session's resume
        # secret, and what it sent without an answer (``fabric.transport.takeover``)
        self.brokers = list(brokers) if len(brokers) > 1 else []
        self.resume_keys: dict[int, bytes] = {}
        self.shared_memory = shared_memory  # (sets bulk_elements)
        self.segments: SegmentPool | None = None  # made at a session's first bulk transfer
        self.role = role  # whose token it shows: "client" or "admin"
        self.curve = curve  # CURVE keys: the connection is encrypted, the broker checks them
        # Whether it, and each session it carries, may still be used (and why not: the first
        # loss's error); the pending table loses a session the broker says is lost.
        self.life = ConnectionLife()
        self.pending = PendingTable(self.life)
        self.unanswered = Unanswered(lambda session: self.pending.done.get(session, 0),
                                     self.pending.waits_for) if self.brokers else None
        self._thread = threading.get_ident()
        self._context = zmq.Context.instance()
        self.socket = self._context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, new_routing_id())
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_limit * 1000))
        self.socket.setsockopt(zmq.HEARTBEAT_IVL, CLIENT_HEARTBEAT_MS)
        self.socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, CLIENT_HEARTBEAT_TIMEOUT_MS)
        self.socket.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        # The largest frame this socket takes; the broker keeps replies within it (HELLO).
        self.max_message_bytes = max_message_bytes
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.set_send_timeout(10.0)
        # The broker admits a connection only with a token (or with CURVE, an allowed key).
        if curve is not None:
            curve.apply(self.socket)
        else:
            present_token(self.socket, role, token)
        self._monitor = self.socket.get_monitor_socket(_WATCHED_EVENTS)
        # What a wait polls, for zmq.zmq_poll itself (a Poller adds a Python call per wait).
        self._poll_items = [(self.socket, POLLIN), (self._monitor, POLLIN)]
        self._message_waits = message_check(self.socket)
        self.established = False  # set once a reply proves a fabric broker is there
        self.users = 0  # sessions open over this connection
        try:
            self.socket.connect(address)
        except zmq.ZMQError as exc:
            self.close()
            raise ConnectError(f"Cannot connect to {address!r}: {exc}. Use an address like "
                               "tcp://host:port or ipc:///path.") from None

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise FabricError(ONE_THREAD)

    def set_send_timeout(self, seconds: float) -> None:
        """How long ``send`` may wait for room in the queue to the broker."""
        self.send_timeout = seconds
        self.socket.setsockopt(zmq.SNDTIMEO, int(seconds * 1000))

    def send(self, message: Message) -> None:
        """Queue a message to the broker (no reply expected)."""
        self._send(message)
        if self.brokers:  # a client that only streams ops finds its broker gone here too
            self._watch_monitor()
        # Read what has come meanwhile: a client that only streams ops still reads, so the
        # broker never holds messages for it (it cuts off clients that leave them unread).
        self._drain()

    def _watch_monitor(self) -> None:
        """Act on the monitor's events that have come, without waiting for any."""
        while zmq.zmq_poll([(self._monitor, POLLIN)], 0):
            if self._on_event(recv_monitor_event(self._monitor)):
                return

    def _send(self, message: Message) -> None:
        """Queue a message, or raise why the connection or its session cannot take it."""
        if threading.get_ident() != self._thread:  # (every message: the call only to raise)
            self._check_thread()
        # Known lost: fail now, send nothing (``ConnectionLife.error_of``, inline: every message)
        error = self.life.sessions.get(message.session, self.life).error
        if error is not None:
            raise error
        try:
            send_frames(self.socket, protocol.encode(message))
            if self.unanswered is not None:
                self.unanswered.sent(message)
        except zmq.Again:
            raise RequestTimeout(
                f"The broker at {self.address} took none of the {SEND_QUEUE} queued messages "
                f"in {self.send_timeout:g} s: it or the device's worker is overloaded or gone."
            ) from None

    def request(self, message: Message, timeout: float, *, session: int = 0) -> Message:
        """Send a request and wait for its reply (matched by request id) until the deadline."""
        return self.wait_for_reply(self.send_request(message), timeout, session=session)

    def send_request(self, message: Message) -> int:
        """Send a request without waiting for its reply: its request id, for
        ``wait_for_reply`` (so that many requests are in flight at once)."""
        request = self.pending.new_request()
        try:
            # Unlike ``send``, no read right after: the wait reads everything that has come.
            self._send(protocol.with_request(message, request))
        except BaseException:
            self.pending.forget(request)
            raise
        return request

    def wait_for_reply(self, request: int, timeout: float, *, session: int = 0,
                       keep_on_timeout: bool = False) -> Message:
        """The reply to ``request`` (sent by ``send_request``), waited for until the deadline;
        on any error the request is forgotten (a late reply is dropped), but for the
        deadline's ``RequestTimeout`` where ``keep_on_timeout`` (it is waited for again)."""
        try:
            reply = self._wait_for(self.pending.take, request, time.monotonic() + timeout,
                                   session, self._timeout_error)
        except RequestTimeout:
            if not keep_on_timeout:
                self.pending.forget(request)
            raise
        except BaseException:
            self.pending.forget(request)
            raise
        if reply.kind is _ERROR and reply.body.get("code") == SessionLost.code:
            error = self.life.error_of(session)
            if error is not None:
                # The earlier loss says why the session ended; this answer only says it is
                # gone.
                raise error
        return reply

    def wait_for_credit(self, session: int, done: int, deadline: float,
                        timeout_error: Callable[[float], FabricError]) -> None:
        """Wait until the device has run ``done`` of ``session``'s SUBMITs (its CREDIT)."""
        self._check_thread()
        self._wait_for(lambda needed: self.pending.done.get(session, 0) >= needed or None, done,
                       deadline, session, timeout_error)

    def _wait_for(self, ready: Callable[[Any], Any], key: Any, deadline: float, session: int,
                  timeout_error: Callable[[float], FabricError]) -> Any:
        """Read messages until ``ready(key)`` is not None, and return it; raise the typed
        error if the session or the connection is lost, or the deadline passes, first
        (the caller checked the thread). (``ready`` and ``key`` apart: a ``partial`` of them,
        made and freed on every read, cost a hundredth of its client instructions.)"""
        while True:
            result = ready(key)
            if result is not None:
                return result
            error = self.life.sessions.get(session, self.life).error  # (error_of, inline)
            if error is not None:
                raise error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timeout_error(deadline)
            for sock, _ in zmq.zmq_poll(self._poll_items, int(remaining * 1000)):
                if sock is self._monitor:
                    started = time.monotonic()
                    if self._on_event(recv_monitor_event(self._monitor)):
                        deadline += time.monotonic() - started  # (a takeover's time)
                        break  # (the poll's sockets are the old ones)
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

    def receive_arrived(self) -> None:
        """File every message that has come (``pending``), without waiting for any."""
        self._check_thread()
        self._drain()

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

    def _on_event(self, event: dict[str, Any]) -> bool:
        """Act on a monitor event; whether a takeover moved the connection to another
        broker."""
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED or kind == zmq.EVENT_CONNECTED:
            return False
        if self.established:
            if kind == zmq.EVENT_DISCONNECTED and self.resume_keys and self.brokers:
                takeover.take_over(self)
                return True
            if kind == zmq.EVENT_DISCONNECTED:
                self.life.lose(SessionLost(
                    f"The connection to the broker at {self.address} was lost: its sessions "
                    "are gone. Open a new session once the broker is back."))
            return False
        security = handshake_error(kind, event["value"], self.address,
                                   encrypted=self.curve is not None, role=self.role)
        if security is not None:  # ZeroMQ is silent about these but for this event
            self.life.lose(security)
        elif kind == zmq.EVENT_CONNECT_RETRIED:  # (libzmq retries an unknown host name too)
            self.life.lose(ConnectError(host_not_resolving(self.address) or (
                f"Nothing is listening at {self.address}: start a broker there "
                "(fabric broker --frontend ...) or check the address.")))
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            self.life.lose(ConnectError(
                f"The peer at {self.address} is not a fabric broker (it broke the ZeroMQ "
                "handshake): check the address and port."))
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and event["value"] == errno.EAGAIN:
            self.life.lose(ConnectError(
                f"The peer at {self.address} did not complete a ZeroMQ handshake: it is not a "
                "fabric broker (an HTTP server?). Check the address and port."))
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED):
            self.life.lose(ServerDisconnected(
                f"Server disconnected during initialization: {self.address} closed the "
                "connection before the broker answered. Check that the address is a fabric "
                "broker's frontend and read the broker's log."))
        return False

    # -- a takeover (``fabric.transport.takeover``) ------------------------------------------

    def sibling(self, address: str, *, handshake_limit: float) -> "Connection":
        """A new connection to ``address`` (another broker of the pair) as this one was made:
        its token, keys and message bound."""
        return Connection(address, self.token, curve=self.curve,
                          max_message_bytes=self.max_message_bytes,
                          handshake_limit=handshake_limit)

    def adopt(self, fresh: "Connection") -> None:
        """Go on over ``fresh``'s socket (a connection to the broker that took over), this
        connection's own closed."""
        self._close_socket()
        self.address, self.socket, self._monitor = fresh.address, fresh.socket, fresh._monitor
        self._poll_items = fresh._poll_items
        self._message_waits = fresh._message_waits
        self.socket.setsockopt(zmq.SNDTIMEO, int(self.send_timeout * 1000))
        fresh.life.close()  # (its socket is this connection's now: never closed by it)

    def resumed(self, session: int, submits: int) -> None:
        """The broker that took over resumed ``session``, whose device ran ``submits`` of its
        batches: what it sent without an answer goes again."""
        self.pending.done[session] = max(submits, self.pending.done.get(session, 0))
        for message in self.unanswered.again(session, submits):
            self._send(message)

    def lose_session(self, session: int, error: FabricError) -> None:
        """``session`` could not be resumed, for ``error``."""
        self.life.lose_session(session, error)
        self.forget_session(session)

    def forget_session(self, session: int) -> None:
        """A session closed or was lost: it is not resumed at a takeover."""
        self.resume_keys.pop(session, None)
        if self.unanswered is not None:
            self.unanswered.forget(session)

    @property
    def shared_memory(self) -> SharedMemory | None:
        """How large arrays may use shared memory over this connection (None: never)."""
        return self._shared_memory

    @shared_memory.setter
    def shared_memory(self, options: SharedMemory | None) -> None:
        self._shared_memory = options
        # Arrays of fewer elements never use it (whatever their dtype: complex128, 16 bytes,
        # is the largest): the one test a small read or upload makes.
        self.bulk_elements = math.inf if options is None else options.threshold // 16

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (its life is CLOSED)."""
        return self.life.phase is CLOSED

    def close(self, linger: float = 0.0) -> None:
        """Close the socket and its monitor; safe to call twice."""
        if self.life.close() is CLOSED:  # (closed before)
            return
        if self.segments is not None:
            self.segments.close()
        self._close_socket(linger)

    def _close_socket(self, linger: float = 0.0) -> None:
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self.socket.close(linger=int(linger * 1000))


def check_version(reply: Message) -> None:
    """Raise ``VersionMismatch`` if ``reply`` speaks another protocol version."""
    if reply.version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"The broker speaks protocol version {reply.version} and this client speaks "
            f"{PROTOCOL_VERSION}: install matching fabric versions.",
            client_version=PROTOCOL_VERSION, server_version=reply.version)


def expect_reply(reply: Message, expected: Kind) -> Message:
    """The reply if it is of the ``expected`` kind; the typed error it carries otherwise."""
    if reply.kind is expected and reply.version == PROTOCOL_VERSION:
        return reply  # (every read's answer: the commonest case is tested first)
    check_version(reply)
    if reply.kind in (Kind.REJECT, Kind.ERROR):
        raise error_from_wire(reply.body)
    if reply.kind != expected:
        raise ConnectError(f"The peer answered with {reply.kind.name}, not {expected.name}: "
                           "it is not a fabric broker's frontend.")
    return reply



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



def list_devices(address: str, token: str, timeout: float, curve: CurveClient | None,
                 connection_file: str | None = None) -> list[Device]:
    """Every device of every worker registered with the broker at ``address``, asked over a
    connection of its own (``connection_file``: where the address came from, if a file)."""
    connection = Connection(address, token, handshake_limit=min(timeout, ZMTP_HANDSHAKE_LIMIT),
                            curve=curve)
    try:
        with naming_connection_file(connection_file):
            return ask_devices(connection, token, timeout)
    finally:
        connection.close()


def ask_devices(connection: Connection, token: str, timeout: float) -> list[Device]:
    """Every online device of the broker ``connection`` reaches, as it lists them."""
    reply = connection.request(Message(Kind.DEVICES, body={"token": token}), timeout)
    return [Device.from_wire(d) for d in expect_reply(reply, Kind.DEVICE_LIST).body["devices"]]
