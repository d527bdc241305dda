"""Floods against a real broker: its log stays bounded, PINGs stay cheap, clients are served.

Raw pyzmq peers (``rawpeers``) send frames built with ``fabric.core.protocol``: refused tokens,
junk and messages from unregistered workers on both sockets, then a PING flood from one
client holding many sessions. Every flood is bounded in count, every wait has a deadline, and
a legitimate client's results are checked meanwhile. Timings are not asserted here (see
``bench/floods.py``).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Iterator

import numpy as np
import pytest
import zmq
from conftest import HEARTBEAT
from polling import wait_for
from rawpeers import RawDealer, frames_of

from fabric import Admin, LocalCluster
from fabric.core.protocol import Kind
from fabric.core.security import present_token

WRONG_TOKEN = "not-a-token-of-this-cluster-5e1d"
PEERS = 6  # raw connections per socket
ROUNDS = 60  # of each attack per connection
SEND_TIMEOUT_MS = 5000  # a raw peer's send waits no longer than this
PING_SESSIONS = 200  # held by the PING flooder (under the default per-client limit)
PING_ROUNDS, PINGS_PER_ROUND = 20, 500


@pytest.fixture(scope="module")
def one_worker_cluster() -> Iterator[LocalCluster]:
    """A broker and one worker at the default log level, for the whole module (the shared
    ``cluster`` has two workers, started again for each test)."""
    with LocalCluster(workers=1, heartbeat=HEARTBEAT) as running:
        yield running


def _counters(cluster: LocalCluster) -> dict[str, int]:
    with Admin(cluster.address, token=cluster.admin_token) as admin:
        return dict(admin.status()["counters"])


def _wait_for_counts(cluster: LocalCluster, before: dict[str, int],
                     expected: dict[str, int], timeout: float = 30.0) -> None:
    """Until the broker has counted ``expected`` more of each counter than ``before``."""
    def gained() -> dict[str, int]:
        now = _counters(cluster)
        return {name: now.get(name, 0) - before.get(name, 0) for name in expected}

    wait_for(lambda: gained() == expected, timeout, f"the broker to count {expected} more")


def _log_size(cluster: LocalCluster) -> int:
    return os.path.getsize(os.path.join(cluster.log_dir, "broker.log"))


def _log_since(cluster: LocalCluster, offset: int) -> str:
    with open(os.path.join(cluster.log_dir, "broker.log"), "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _assert_served(cluster: LocalCluster) -> None:
    with cluster.connect(device=0, timeout=5) as session:
        x = session.asarray(np.arange(10.0))
        assert ((x * 2).sum()).numpy() == 90.0


def test_a_refusal_and_junk_flood_leaves_a_bounded_log_and_clients_are_served(
        one_worker_cluster):
    cluster = one_worker_cluster
    frontend_attacks = [
        frames_of(Kind.HELLO, {"token": WRONG_TOKEN, "device": 0}, session=7, request=1),
        frames_of(Kind.DEVICES, {"token": WRONG_TOKEN}, request=2),
        frames_of(Kind.ADMIN, {"token": WRONG_TOKEN, "command": "status", "args": {}}),
        [b"junk, not a header"],
    ]
    worker_socket_attacks = [
        frames_of(Kind.REGISTER, {"token": WRONG_TOKEN, "name": "intruder",
                                  "backend": "numpy", "devices": [{}]}),
        frames_of(Kind.HEARTBEAT),  # from an unregistered worker
        [b"junk, not a header"],
    ]
    before, offset = _counters(cluster), _log_size(cluster)
    options = {zmq.SNDTIMEO: SEND_TIMEOUT_MS}
    dealers = [RawDealer(cluster.address, cluster.token, options) for _ in range(PEERS)] + [
        RawDealer(cluster.worker_address, cluster.worker_token, options) for _ in range(PEERS)]
    try:
        for _ in range(ROUNDS):
            for dealer in dealers[:PEERS]:
                for frames in frontend_attacks:
                    dealer.send(frames)
            for dealer in dealers[PEERS:]:
                for frames in worker_socket_attacks:
                    dealer.send(frames)
        _assert_served(cluster)  # while the broker works through the flood
        sent = PEERS * ROUNDS
        _wait_for_counts(cluster, before, {
            "tokens_refused": 4 * sent, "frontend_protocol_errors": sent,
            "workers_protocol_errors": sent, "unregistered_worker_messages": sent})
    finally:
        for dealer in dealers:
            dealer.close()
    _assert_served(cluster)
    # (without this test's own polls of the admin status, which are logged as they come)
    lines = [line for line in _log_since(cluster, offset).splitlines()
             if " admin command " not in line]
    written = "\n".join(lines)
    # One line for the first of each of the 6 kinds (and, past the interval, one summary
    # each), where the broker used to write one per message: 7 x 360 lines.
    assert len(lines) <= 12, written[:2000]
    assert len(written.encode()) <= 12 * 300, written[:2000]
    assert "rejected handshake (unauthorized)" in written
    assert WRONG_TOKEN not in written


def test_a_ping_flood_from_a_client_with_many_sessions_keeps_them_and_others_are_served(
        one_worker_cluster):
    cluster = one_worker_cluster
    with RawDealer(cluster.address, cluster.token, {zmq.SNDTIMEO: SEND_TIMEOUT_MS}) as flooder, \
            cluster.connect(device=0, timeout=5) as other:
        for session in range(1, PING_SESSIONS + 1):
            flooder.send(frames_of(Kind.HELLO, {"token": cluster.token, "device": 0},
                                   session=session, request=session))
        for _ in range(PING_SESSIONS):
            assert flooder.recv_message(timeout=10).kind == Kind.WELCOME
        x = other.asarray(np.arange(1000.0))
        for round_ in range(PING_ROUNDS):
            for ping in range(PINGS_PER_ROUND):
                flooder.send(frames_of(Kind.PING, request=ping))
            assert (x + round_).sum().numpy() == 499_500.0 + 1000 * round_  # served meanwhile
            for _ in range(PINGS_PER_ROUND):
                assert flooder.recv_message(timeout=10).kind == Kind.PONG
        with Admin(cluster.address, token=cluster.admin_token) as admin:
            held = [row for row in admin.sessions() if row["id"] != f"{other.id:#018x}"]
        assert len(held) == PING_SESSIONS
        for session in range(1, PING_SESSIONS + 1):  # every one still open, and closes
            flooder.send(frames_of(Kind.CLOSE, session=session, request=session))
        closed = {flooder.recv_until(lambda m: m.kind == Kind.CLOSED, timeout=10).session
                  for _ in range(PING_SESSIONS)}
        assert closed == set(range(1, PING_SESSIONS + 1))


# -- connections that never finish the handshake ---------------------------------------------

IDLE, JUNK, REFUSED = 200, 200, 100  # raw connections of each kind
HANDSHAKE_TIMEOUT = 1.0


def _closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Read (the broker's greeting, say) until the broker closes the connection or the
    deadline passes: True if it closed it."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(4096):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def short_handshakes() -> Iterator[LocalCluster]:
    """A broker that gives a peer HANDSHAKE_TIMEOUT to finish the ZeroMQ handshake."""
    with LocalCluster(workers=1, heartbeat=HEARTBEAT, broker_args=(
            "--handshake-timeout", str(HANDSHAKE_TIMEOUT))) as running:
        yield running


def test_idle_junk_and_tokenless_connections_are_dropped_and_clients_are_served(
        short_handshakes):
    cluster = short_handshakes
    pid = cluster.broker.pid
    baseline, offset = _open_files(pid), _log_size(cluster)
    with Admin(cluster.address, token=cluster.admin_token) as admin:
        refused_before = admin.status()["rejects"].get("unauthorized", 0)
    host, port = cluster.address[len("tcp://"):].rsplit(":", 1)
    raw: list[socket.socket] = []
    context = zmq.Context()
    try:
        for i in range(IDLE + JUNK):
            sock = socket.create_connection((host, int(port)), timeout=5)
            raw.append(sock)
            if i >= IDLE:  # what libzmq takes for the start of a ZMTP 1.0 handshake
                sock.sendall(b"\x01\x00")
        dealers = [context.socket(zmq.DEALER) for _ in range(REFUSED)]
        for dealer in dealers:
            dealer.setsockopt(zmq.LINGER, 0)
            present_token(dealer, "client", WRONG_TOKEN)
            dealer.connect(cluster.address)
        # the broker holds them for now (once its I/O thread has accepted them: well within
        # the handshake timeout, which then closes them)
        wait_for(lambda: _open_files(pid) > baseline, HANDSHAKE_TIMEOUT,
                 "the broker to accept the connections", interval=0.01)
        _assert_served(cluster)  # meanwhile
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT + 10
        assert all(_closed_by_peer(sock, deadline) for sock in raw)

        def refused() -> int:
            with Admin(cluster.address, token=cluster.admin_token) as admin:
                return admin.status()["rejects"]["unauthorized"] - refused_before

        wait_for(lambda: refused() == REFUSED, 10, "the broker to refuse every wrong token")
    finally:
        for sock in raw:
            sock.close()
        context.destroy(linger=0)
    wait_for(lambda: _open_files(pid) <= baseline + 2, 10, "the broker to close them all")
    _assert_served(cluster)
    lines = [line for line in _log_since(cluster, offset).splitlines()
             if " admin command " not in line]
    assert len(lines) <= 4, "\n".join(lines)[:2000]  # the refusals: one line (and a summary)
    assert WRONG_TOKEN not in "\n".join(lines)
