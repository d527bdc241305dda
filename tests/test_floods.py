"""Floods against a real broker: its log stays bounded, PINGs stay cheap, clients are served.

Raw pyzmq peers (``rawpeers``) send frames built with ``fabric.protocol``: refused tokens,
junk and messages from unregistered workers on both sockets, then a PING flood from one
client holding many sessions. Every flood is bounded in count, every wait has a deadline, and
a legitimate client's results are checked meanwhile. Timings are not asserted here (see
``bench/floods.py``).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pytest
import zmq
from conftest import HEARTBEAT
from faultproxy import wait_for
from rawpeers import RawDealer, frames_of

from fabric import Admin, LocalCluster
from fabric.protocol import Kind

WRONG_TOKEN = "not-a-token-of-this-cluster-5e1d"
PEERS = 6  # raw connections per socket
ROUNDS = 60  # of each attack per connection
SEND_TIMEOUT_MS = 5000  # a raw peer's send waits no longer than this
PING_SESSIONS = 200  # held by the PING flooder (under the default per-client limit)
PING_ROUNDS, PINGS_PER_ROUND = 20, 500


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A broker and one worker at the default log level."""
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


def test_a_refusal_and_junk_flood_leaves_a_bounded_log_and_clients_are_served(cluster):
    frontend_attacks = [
        frames_of(Kind.HELLO, {"token": WRONG_TOKEN, "device": 0}, session=7, request=1),
        frames_of(Kind.DEVICES, {"token": WRONG_TOKEN}, request=2),
        frames_of(Kind.ADMIN, {"token": WRONG_TOKEN, "command": "status", "args": {}}),
        [b"junk, not a header"],
    ]
    backend_attacks = [
        frames_of(Kind.REGISTER, {"token": WRONG_TOKEN, "name": "intruder",
                                  "backend": "numpy", "devices": [{}]}),
        frames_of(Kind.HEARTBEAT),  # from an unregistered worker
        [b"junk, not a header"],
    ]
    before, offset = _counters(cluster), _log_size(cluster)
    options = {zmq.SNDTIMEO: SEND_TIMEOUT_MS}
    dealers = [RawDealer(cluster.address, cluster.token, options) for _ in range(PEERS)] + [
        RawDealer(cluster.backend_address, cluster.worker_token, options) for _ in range(PEERS)]
    try:
        for _ in range(ROUNDS):
            for dealer in dealers[:PEERS]:
                for frames in frontend_attacks:
                    dealer.send(frames)
            for dealer in dealers[PEERS:]:
                for frames in backend_attacks:
                    dealer.send(frames)
        _assert_served(cluster)  # while the broker works through the flood
        sent = PEERS * ROUNDS
        _wait_for_counts(cluster, before, {
            "tokens_refused": 4 * sent, "frontend_protocol_errors": sent,
            "backend_protocol_errors": sent, "unregistered_worker_messages": sent})
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
        cluster):
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
