"""End-to-end: every failed handshake is a typed error within its bound, saying what to do.

Fake peers (nothing listening, a socket that closes, an HTTP server, ZeroMQ ROUTERs that
misbehave) are real servers on loopback or ipc://; broker-side refusals use the real
``cluster`` fixture. Bounds are the ones the client promises, measured with time.monotonic().
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import re
import threading
import time
from typing import Iterator

import pytest
import zmq
from conftest import HEARTBEAT, assert_broker_serves
from rawpeers import (
    AdmittingContext,
    RawDealer,
    ServerThread,
    frames_of,
    free_ipc_address,
    free_tcp_address,
    poll_until,
)

import fabric
from fabric.core import protocol
from fabric.core.errors import DuplicateSession, error_from_wire
from fabric.core.protocol import PROTOCOL_VERSION, Kind


def _connect_error(address: str, **kwargs):
    """Connect, expecting a failure; return (the error, when it was raised, how long it took)."""
    kwargs.setdefault("token", "any-token")
    started = time.monotonic()
    with pytest.raises(fabric.FabricError) as info:
        fabric.connect(address, **kwargs)
    raised = time.monotonic()
    return info.value, raised, raised - started


# -- nothing there, or not a fabric broker ---------------------------------------------------

def test_nothing_listening_on_tcp_is_a_connect_error_at_once():
    address = free_tcp_address()
    error, _, took = _connect_error(address, timeout=10)
    assert type(error) is fabric.ConnectError
    assert took < 2.0
    assert "Nothing is listening" in error.message and "start a broker" in error.message


def test_nothing_listening_on_ipc_is_a_connect_error_at_once():
    address, tmp = free_ipc_address()
    with tmp:
        error, _, took = _connect_error(address, timeout=10)
    assert type(error) is fabric.ConnectError
    assert took < 2.0
    assert "Nothing is listening" in error.message and "start a broker" in error.message


def _accept_then_close(server: ServerThread) -> None:
    # A plain TCP server: accepts one connection, says nothing, closes it after ~0.3 s.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.05)
        server.address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        server.ready.set()
        deadline = time.monotonic() + 10
        while not server.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            time.sleep(0.3)
            conn.close()
            server.closed_at = time.monotonic()
            return


@contextlib.contextmanager
def _bound_router(server: ServerThread) -> Iterator[zmq.Socket]:
    """A ROUTER on a free loopback port that admits any token, announced through ``server``;
    closed on exit."""
    with AdmittingContext() as admitting:
        sock = admitting.router()
        try:
            server.address = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
            server.ready.set()
            yield sock
        finally:
            sock.close(linger=0)


def _router_closes_after_hello(server: ServerThread) -> None:
    # A ZeroMQ ROUTER that completes the ZeroMQ handshake, takes the HELLO, then closes.
    try:
        with _bound_router(server) as sock:
            if poll_until(server.stop, sock, time.monotonic() + 10):
                server.received.append(sock.recv_multipart())
    finally:
        server.closed_at = time.monotonic()


@pytest.mark.parametrize("peer", [_accept_then_close, _router_closes_after_hello],
                         ids=["tcp-socket", "zmq-router"])
def test_peer_closing_before_welcome_is_server_disconnected(peer):
    with ServerThread(peer) as server:
        error, raised, _ = _connect_error(server.address, timeout=10)
    assert server.error is None
    assert server.closed_at is not None
    assert type(error) is fabric.ServerDisconnected
    assert "Server disconnected during initialization" in error.message
    assert "fabric broker" in error.message  # says what to check
    assert raised - server.closed_at < 1.0
    if peer is _router_closes_after_hello:
        hello = protocol.decode(server.received[0][1:])
        assert hello.kind == Kind.HELLO


def test_http_server_is_a_connect_error():
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        error, _, took = _connect_error(f"tcp://127.0.0.1:{httpd.server_address[1]}",
                                        timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    assert isinstance(error, (fabric.ConnectError, fabric.ProtocolError))
    assert took < 2.0
    assert "not a fabric broker" in error.message


def _silent_router(server: ServerThread) -> None:
    with _bound_router(server) as sock:
        deadline = time.monotonic() + 10
        while poll_until(server.stop, sock, deadline):
            server.received.append(sock.recv_multipart())


def test_silent_zmq_peer_is_a_handshake_timeout_at_the_timeout():
    with ServerThread(_silent_router) as server:
        error, _, took = _connect_error(server.address, timeout=1.0)
    assert type(error) is fabric.HandshakeTimeout
    assert 0.9 <= took < 2.0
    assert "raise timeout=" in error.message
    # The client asked the silent peer to drop the session it gave up on.
    kinds = [protocol.decode_header(frames[1]).kind for frames in server.received]
    assert kinds[0] == Kind.HELLO
    assert Kind.CLOSE in kinds


def _router_answering_another_version(server: ServerThread) -> None:
    with _bound_router(server) as sock:
        if poll_until(server.stop, sock, time.monotonic() + 10):
            identity, header, _ = sock.recv_multipart()
            hello = protocol.decode_header(header)
            sock.send_multipart([identity, *frames_of(
                Kind.WELCOME, {"future": True}, session=hello.session, request=hello.request,
                version=PROTOCOL_VERSION + 1)])
            poll_until(server.stop, sock, time.monotonic() + 2)  # let it arrive


def test_broker_of_another_version_is_a_version_mismatch_on_the_client():
    with ServerThread(_router_answering_another_version) as server:
        error, _, took = _connect_error(server.address, timeout=10)
    assert type(error) is fabric.VersionMismatch
    assert took < 1.0
    assert error.client_version == PROTOCOL_VERSION
    assert error.server_version == PROTOCOL_VERSION + 1
    assert "install matching fabric versions" in error.message


# -- refusals by the real broker -------------------------------------------------------------

def _hello(cluster, session: int, *, token: str | None = None, device: int = 0,
           request: int = 1, version: int = PROTOCOL_VERSION) -> list[bytes]:
    return frames_of(Kind.HELLO, {"token": cluster.token if token is None else token,
                                  "device": device}, session=session, request=request,
                     version=version)


def _open_and_close_raw(dealer: RawDealer, cluster, session: int) -> None:
    """Open ``session`` with a well-formed HELLO from ``dealer``, then close it."""
    dealer.send(_hello(cluster, session, request=100))
    welcome = dealer.recv_until(lambda m: m.request == 100)
    assert welcome.kind == Kind.WELCOME, welcome.body
    assert welcome.session == session
    dealer.send(frames_of(Kind.CLOSE, session=session, request=101))
    closed = dealer.recv_until(lambda m: m.request == 101)
    assert closed.kind == Kind.CLOSED


def test_wrong_token_is_an_authentication_error(cluster):
    error, _, took = _connect_error(cluster.address, token="not-the-token", timeout=10)
    assert type(error) is fabric.AuthenticationError
    assert took < 1.0
    assert "token" in error.message
    assert_broker_serves(cluster)


@pytest.mark.parametrize("device", [2, 17, -1])
def test_device_out_of_range_is_no_such_device(cluster, device):
    error, _, took = _connect_error(cluster.address, token=cluster.token, device=device,
                                    timeout=10)
    assert type(error) is fabric.NoSuchDevice
    assert took < 1.0
    assert error.device_count == 2
    assert "fabric.devices()" in error.message
    assert_broker_serves(cluster)


@pytest.mark.parametrize("case", ["token", "device", "version"])
def test_refused_hello_leaves_no_state_behind(cluster, case):
    """A refused HELLO creates nothing: the same session id then opens normally."""
    session = 0x5EED0000 + len(case)
    hello = {"token": dict(token="wrong"), "device": dict(device=2),
             "version": dict(version=PROTOCOL_VERSION + 1)}[case]
    expected = {"token": fabric.AuthenticationError, "device": fabric.NoSuchDevice,
                "version": fabric.VersionMismatch}[case]
    with RawDealer(cluster.address, cluster.token) as dealer:
        started = time.monotonic()
        dealer.send(_hello(cluster, session, **hello))
        reject = dealer.recv_message(timeout=2)
        assert time.monotonic() - started < 1.0
        assert reject.kind == Kind.REJECT
        assert (reject.session, reject.request) == (session, 1)
        assert type(error_from_wire(reject.body)) is expected
        _open_and_close_raw(dealer, cluster, session)
    assert_broker_serves(cluster)


def test_wrong_protocol_version_is_a_version_mismatch_with_both_versions(cluster):
    with RawDealer(cluster.address, cluster.token) as dealer:
        started = time.monotonic()
        dealer.send(_hello(cluster, 0xF00D, version=PROTOCOL_VERSION + 1))
        reject = dealer.recv_message(timeout=2)
        assert time.monotonic() - started < 1.0
    assert reject.kind == Kind.REJECT
    error = error_from_wire(reject.body)
    assert type(error) is fabric.VersionMismatch
    assert error.client_version == PROTOCOL_VERSION + 1
    assert error.server_version == PROTOCOL_VERSION
    assert "install matching fabric versions" in error.message
    assert_broker_serves(cluster)


def test_hello_reusing_an_open_session_id_is_rejected(cluster):
    with cluster.connect(device=0, timeout=5) as session, \
            RawDealer(cluster.address, cluster.token) as dealer:
        started = time.monotonic()
        dealer.send(_hello(cluster, session.id, device=1))
        reject = dealer.recv_message(timeout=2)
        assert time.monotonic() - started < 1.0
        assert reject.kind == Kind.REJECT
        error = error_from_wire(reject.body)
        assert type(error) is DuplicateSession and error.code == "duplicate_session"
        assert "fresh random id" in error.message
        session.sync()  # the owner's session is untouched
        assert session.device.index == 0
    # Once closed by its owner, the id is free again: the refusal left nothing behind.
    with RawDealer(cluster.address, cluster.token) as dealer:
        _open_and_close_raw(dealer, cluster, session.id)
    assert_broker_serves(cluster)


def test_two_hellos_with_one_session_id_open_it_once(cluster):
    session = 0xD0B1E
    with RawDealer(cluster.address, cluster.token) as dealer:
        started = time.monotonic()
        dealer.send(_hello(cluster, session, request=1))
        dealer.send(_hello(cluster, session, request=2))
        answers = {}
        while len(answers) < 2:
            message = dealer.recv_message(timeout=2)
            answers[message.request] = message
        assert time.monotonic() - started < 1.0
        assert answers[1].kind == Kind.WELCOME
        assert answers[2].kind == Kind.REJECT
        assert error_from_wire(answers[2].body).code == "duplicate_session"
        dealer.send(frames_of(Kind.CLOSE, session=session, request=3))
        assert dealer.recv_until(lambda m: m.request == 3).kind == Kind.CLOSED
    with RawDealer(cluster.address, cluster.token) as dealer:
        _open_and_close_raw(dealer, cluster, session)
    assert_broker_serves(cluster)


# -- the device's worker dies during the open ------------------------------------------------

def test_worker_dying_during_open_is_a_handshake_error(cluster):
    devices = fabric.devices(cluster.address, token=cluster.token)
    victim = cluster.workers[1]
    other = next(d for d in devices if d.worker == "worker-0")
    target = next(d for d in devices if d.worker == "worker-1")
    killer = threading.Timer(0.3, lambda: os.kill(victim.pid, signal.SIGKILL))
    try:
        os.kill(victim.pid, signal.SIGSTOP)  # it can no longer answer the OPEN
        killer.start()
        error, _, took = _connect_error(cluster.address, token=cluster.token,
                                        device=target.index, timeout=10)
    finally:
        killer.cancel()
        killer.join(5)
        if victim.poll() is None:
            victim.kill()  # also ends a stopped process
        victim.wait(5)  # reaped
    assert isinstance(error, fabric.HandshakeError)
    assert not isinstance(error, fabric.NoSuchDevice), "the worker was lost before the HELLO"
    # Lost within the heartbeat window: liveness 3 x HEARTBEAT, plus a beat of slack per side.
    assert took < HEARTBEAT * (cluster.liveness + 2) + 1.0
    assert error.details.get("reason") == "worker_lost"
    assert "worker-1" in error.message and "retry, or choose another device" in error.message
    # The broker keeps serving the other worker's device.
    with cluster.connect(device=other.index, timeout=5) as session:
        assert session.device.worker == "worker-0"
        session.sync()
    assert [d.worker for d in fabric.devices(cluster.address, token=cluster.token)] == [
        "worker-0"]


@pytest.mark.parametrize("arguments, named", [
    ({"device": "1"}, "device= takes a device index (an int), not str '1'"),
    ({"device": True}, "device= takes"),
    ({"timeout": "5"}, "timeout= takes seconds"),
    ({"max_message_bytes": 1.5e9}, "max_message_bytes= takes a size in bytes"),
    ({"token": b"secret"}, "token= takes a token (a str)"),
])
def test_a_connect_argument_of_the_wrong_type_is_a_type_error_naming_it(
        shared_cluster, arguments, named):
    call = {"token": shared_cluster.token, **arguments}
    with pytest.raises(TypeError, match=re.escape(named)):
        fabric.connect(shared_cluster.address, **call)


def test_open_and_devices_check_their_argument_types_at_the_call(session, shared_cluster):
    with pytest.raises(TypeError, match=re.escape("device= takes a device index")):
        session.open("1")
    with pytest.raises(TypeError, match=re.escape("timeout= takes seconds")):
        fabric.devices(shared_cluster.address, token=shared_cluster.token, timeout="5")
    with pytest.raises(TypeError, match=re.escape("address= takes a broker address")):
        fabric.devices(5555, token=shared_cluster.token)
    session.sync()  # the session goes on
