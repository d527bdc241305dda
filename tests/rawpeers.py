"""Hand-driven peers for end-to-end tests: raw zmq sockets and fake servers.

Rule: every peer here is a context manager that closes its socket (and joins its thread)
on exit, and every receive has a deadline. Nothing here mocks fabric: the raw peers speak
frames built with ``fabric.core.protocol`` (or deliberately broken ones) to real processes.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

import zmq

from fabric.core import zap_messages
from fabric.core.zap_messages import ZAP_ENDPOINT
from fabric.core import protocol
from fabric.core.protocol import PROTOCOL_VERSION, Header, Kind, Message
from fabric.core.security import present_token


def free_tcp_address() -> str:
    """A loopback address where nothing listens (bound once, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def free_ipc_address() -> tuple[str, tempfile.TemporaryDirectory]:
    """An ipc:// path in a fresh directory where nothing listens (clean up the directory)."""
    tmp = tempfile.TemporaryDirectory(prefix="fabric-test-")
    return f"ipc://{tmp.name}/nothing", tmp


def frames_of(kind: Kind, body: dict[str, Any] | None = None, *, session: int = 0,
              request: int = 0, version: int = PROTOCOL_VERSION) -> list[bytes]:
    """The frames of a message, with any header version (valid or not)."""
    return [Header(kind, session, request, version).pack(), protocol.pack_body(body or {})]


class RawDealer:
    """A DEALER connected to a broker socket, sending frames as given. ``token`` is shown in
    the ZeroMQ handshake as the broker requires (None: none, for a bare ZeroMQ peer);
    ``options`` are socket options set before it connects (``{zmq.RCVHWM: 1}``, say)."""

    def __init__(self, address: str, token: str | None,
                 options: dict[int, Any] | None = None) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if token is not None:
            present_token(self.socket, "client", token)
        for option, value in (options or {}).items():
            self.socket.setsockopt(option, value)
        self.socket.connect(address)

    def __enter__(self) -> "RawDealer":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        self.socket.close(linger=0)

    def send(self, frames: Sequence[bytes]) -> None:
        self.socket.send_multipart(list(frames))

    def send_message(self, message: Message) -> None:
        self.send(protocol.encode(message))

    def recv(self, timeout: float = 2.0) -> list[bytes]:
        """The next message's frames; AssertionError when none arrives before the deadline."""
        if not self.socket.poll(timeout * 1000, zmq.POLLIN):
            raise AssertionError(f"no answer within {timeout} s")
        return self.socket.recv_multipart()

    def recv_message(self, timeout: float = 2.0) -> Message:
        """The next message, decoded (a decode failure fails the test)."""
        return protocol.decode(self.recv(timeout))

    def recv_until(self, predicate: Callable[[Message], bool], timeout: float = 2.0,
                   ) -> Message:
        """The first message that matches, skipping others (heartbeats, say), by a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching answer within {timeout} s")
            message = self.recv_message(remaining)
            if predicate(message):
                return message


class ServerThread:
    """Run ``target(stop_event)`` in a thread; exit sets the event and joins the thread.

    ``target`` must return soon after the event is set (it polls with short timeouts).
    ``closed_at`` is for the target to record when it closed its end, by time.monotonic().
    """

    def __init__(self, target: Callable[["ServerThread"], None]) -> None:
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.address = ""
        self.closed_at: float | None = None
        self.received: list[list[bytes]] = []
        self.error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._target(self)
        except BaseException as exc:  # reported by __exit__
            self.error = exc
        finally:
            self.ready.set()

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        if not self.ready.wait(5.0) or not self.address:
            self.stop.set()
            self._thread.join(5.0)
            raise AssertionError(f"the test server did not start: {self.error!r}")
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self._thread.join(5.0)
        assert not self._thread.is_alive(), "the test server thread did not stop"
        if self.error is not None:
            raise AssertionError(f"the test server failed: {self.error!r}")


def poll_until(stop: threading.Event, sock: zmq.Socket, deadline: float) -> bool:
    """Wait for a message on ``sock`` until ``deadline`` or ``stop``; True if one is ready."""
    while not stop.is_set() and time.monotonic() < deadline:
        if sock.poll(50, zmq.POLLIN):
            return True
    return False


class AdmittingContext:
    """A ZeroMQ context whose PLAIN-server sockets admit every peer, for fake brokers: libzmq
    finishes no PLAIN handshake without a ZAP handler, and fabric's clients and workers always
    show a token. A context manager; make sockets with ``router()`` and close them before exit.
    """

    def __init__(self) -> None:
        self.context = zmq.Context()
        self._zap = self.context.socket(zmq.ROUTER)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._admit, daemon=True)
        self._thread.start()

    def _admit(self) -> None:
        while not self._stop.is_set():
            if self._zap.poll(50, zmq.POLLIN):
                identity, *frames = self._zap.recv_multipart()
                request = zap_messages.parse_request(frames)
                allowed = zap_messages.reply(request.request_id, zap_messages.ALLOWED, "OK", "test")
                self._zap.send_multipart([identity, *allowed])

    def router(self) -> zmq.Socket:
        """A ROUTER that takes PLAIN handshakes (not yet bound)."""
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.plain_server = True
        return sock

    def __enter__(self) -> "AdmittingContext":
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(5.0)
        assert not self._thread.is_alive(), "the ZAP thread did not stop"
        self._zap.close(linger=0)
        self.context.destroy(linger=0)
