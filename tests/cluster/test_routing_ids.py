"""Peers that choose their routing id cannot abort the broker (issue 30, critical).

libzmq 4.3.5 numbers the connections of a ROUTER whose peers set no routing id itself:
``0x00`` and a 32-bit counter that starts at ``generate_random()`` (two calls of an unseeded
``rand()``, so the same values in every process), one per socket made. When the number it
hands out was already claimed by a peer as its own routing id, libzmq asserts and the whole
process exits with SIGABRT (``src/socket_base.cpp:2113``): on the frontend, claims of the
next numbers and then one peer without an id; on the workers' (``ROUTER_HANDOVER``), claims
and then two connections under one id, whose handover numbers the old one.

The defence: authentication in the ZeroMQ handshake, so that a peer without a token (or,
with CURVE, an allowed key) is refused over ZAP before its connection is attached and its
routing id never reaches libzmq's table; and for peers admitted with a token, a broker that
seeds ``rand()`` so that libzmq's numbers cannot be predicted. These tests run the exact
attack, which aborted the broker before, on both sockets, with and without CURVE, and with
a token.
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Iterator

import pytest
import zmq
from conftest import HEARTBEAT
from polling import wait_for
from rawpeers import RawDealer, frames_of

from fabric import LocalCluster
from fabric.core.log_limit import peer_label
from fabric.core.protocol import Kind, Message
from fabric.core.security import generate_keys, present_token
from fabric.core.sockets import new_routing_id

WRONG_TOKEN = "not-a-token-of-this-cluster-91c4"
# libzmq's first counters: each ROUTER the broker makes takes the next generate_random().
COUNTER_STARTS = 4
CLAIMS_PER_START = 64  # numbers claimed past each start: the connections it made before


def _libzmq_counter_starts() -> list[int]:
    """What ``generate_random()`` returns in a fresh process: ``rand() | rand() << 31``."""
    libc = ctypes.CDLL("libc.so.6")
    libc.srand(1)  # what an unseeded rand() starts from
    return [(libc.rand() | libc.rand() << 31) & 0xFFFFFFFF for _ in range(COUNTER_STARTS)]


def _claimed_ids() -> Iterator[bytes]:
    for start in _libzmq_counter_starts():
        for offset in range(CLAIMS_PER_START):
            yield b"\x00" + struct.pack(">I", (start + offset) & 0xFFFFFFFF)


def _attacker(context: zmq.Context, address: str, routing_id: bytes | None, how: str,
              server_key: bytes | None, token: str = WRONG_TOKEN) -> zmq.Socket:
    """A peer that speaks no mechanism (``null``), or PLAIN with ``token`` (``plain``), or
    CURVE with a key of its own (``curve``)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    if how == "plain":
        present_token(sock, "client", token)
    elif how == "curve":
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = (
            public, secret, server_key)
    sock.connect(address)
    return sock


def _trigger(side: str) -> list[bytes | None]:
    """The routing ids of the connections that make libzmq hand out its next number: a peer
    without an id on the frontend; a handover (two under one id) on the workers'."""
    return [None] if side == "frontend" else [b"duplicate", b"duplicate"]


def _attack(cluster: LocalCluster, side: str) -> dict[str, int]:
    """The attack on one socket; the broker's refusal counts after it."""
    address = cluster.address if side == "frontend" else cluster.worker_address
    server_key = cluster.curve.server_key if cluster.curve is not None else None
    # Half speak no mechanism at all; half try the one the broker asks for, wrongly.
    schemes = ["null", "curve" if cluster.curve is not None else "plain"]
    with cluster.admin() as admin:
        before = sum(admin.status()["rejects"].values())
    context = zmq.Context()
    try:
        attackers = [_attacker(context, address, routing_id, schemes[i % 2], server_key)
                     for i, routing_id in enumerate(_claimed_ids())]
        tried = len(attackers) // 2  # those that speak the broker's mechanism
        for routing_id in _trigger(side):
            for how in schemes:
                sock = _attacker(context, address, routing_id, how, server_key)
                attackers.append(sock)
                sock.send(b"anything")
                time.sleep(0.2)
            tried += 1
        # Every attacker that tried the broker's mechanism is refused (and counted).

        def refused() -> int | None:
            with cluster.admin() as admin:
                count = sum(admin.status()["rejects"].values()) - before
            return count if count >= tried else None

        wait_for(refused, timeout=30, what="the broker to refuse every attacker")
        assert cluster.broker.poll() is None, cluster.log_tail("broker", 20)
        for sock in attackers:
            assert not sock.poll(0, zmq.POLLIN)  # nothing ever reached them
    finally:
        context.destroy(linger=0)
    with cluster.admin() as admin:
        return admin.status()["rejects"]


@pytest.fixture(scope="module")
def plain_cluster():
    with LocalCluster(workers=1, heartbeat=HEARTBEAT) as running:
        yield running


@pytest.fixture(scope="module")
def curve_cluster(tmp_path_factory):
    keys = tmp_path_factory.mktemp("routing-ids") / "keys"
    generate_keys(keys)
    with LocalCluster(workers=1, heartbeat=HEARTBEAT, curve=keys) as running:
        yield running


@pytest.mark.timeout(120)
@pytest.mark.parametrize("side", ["frontend", "workers"])
def test_claimed_routing_ids_without_a_token_cannot_abort_the_broker(plain_cluster, side):
    rejects = _attack(plain_cluster, side)
    assert rejects["unauthorized"] >= CLAIMS_PER_START * COUNTER_STARTS // 2
    assert_broker_serves_one(plain_cluster)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("side", ["frontend", "workers"])
def test_claimed_routing_ids_without_an_allowed_key_cannot_abort_the_broker(curve_cluster,
                                                                          side):
    rejects = _attack(curve_cluster, side)
    assert rejects[f"{'client' if side == 'frontend' else 'worker'}_key_refused"] >= (
        CLAIMS_PER_START * COUNTER_STARTS // 2)
    assert_broker_serves_one(curve_cluster)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("side", ["frontend", "workers"])
def test_token_holders_cannot_predict_the_ids_libzmq_hands_out(plain_cluster, side):
    # Admitted peers still choose their ids; the broker seeds rand() so that libzmq's
    # numbers are no longer the ones every process draws.
    address = plain_cluster.address if side == "frontend" else plain_cluster.worker_address
    token = plain_cluster.token if side == "frontend" else plain_cluster.worker_token
    context = zmq.Context()
    try:
        claims = [_attacker(context, address, routing_id, "plain", None, token)
                  for routing_id in _claimed_ids()]
        for sock in claims:  # each is attached: the broker answers its garbage
            sock.send(b"garbage")
        for sock in claims:
            assert sock.poll(10_000, zmq.POLLIN), "an admitted peer got no answer"
        for routing_id in _trigger(side):
            sock = _attacker(context, address, routing_id, "plain", None, token)
            claims.append(sock)
            sock.send(b"garbage")
            assert sock.poll(10_000, zmq.POLLIN), "the broker did not answer the trigger"
    finally:
        context.destroy(linger=0)
    assert_broker_serves_one(plain_cluster)


def assert_broker_serves_one(cluster: LocalCluster) -> None:
    """The broker lists its device and a new session on it runs an op."""
    assert cluster.broker.poll() is None, cluster.log_tail("broker", 20)
    assert [d.worker for d in cluster.devices()] == ["worker-0"]
    with cluster.connect(device=0, timeout=5) as session:
        assert session.arange(4).sum().numpy() == 6


@pytest.mark.timeout(60)
def test_a_vanished_clients_sessions_cannot_be_taken_over_under_its_routing_id(plain_cluster):
    # Issue 30, medium 4: sessions are bound to the connection's routing id. A client's id is
    # a random secret (fabric's own clients choose one); a peer that connects under it, while
    # the client is there or after it is gone, without a token, is refused in the handshake
    # and reaches nothing.
    victim_id = new_routing_id()
    context = zmq.Context()

    def steal() -> None:
        for how in ("null", "plain"):
            thief = _attacker(context, plain_cluster.address, victim_id, how, None)
            for kind in (Kind.REQUEST, Kind.CLOSE):
                thief.send_multipart(frames_of(kind, {"op": "sync"}, session=0x7A4E,
                                               request=2))
            assert not thief.poll(1000, zmq.POLLIN), "a peer without a token got an answer"

    try:
        with RawDealer(plain_cluster.address, plain_cluster.token,
                       {zmq.ROUTING_ID: victim_id}) as victim, plain_cluster.admin() as admin:
            victim.send_message(Message(Kind.HELLO, session=0x7A4E, request=1,
                                        body={"token": plain_cluster.token, "device": 0}))
            assert victim.recv_until(lambda m: m.kind == Kind.WELCOME, 10).session == 0x7A4E
            steal()
            [row] = [r for r in admin.sessions() if r["id"] == f"{0x7A4E:#018x}"]
            assert row["state"] == "open" and row["client"] == peer_label(victim_id)
        # Gone without a CLOSE: the broker ends its session once it finds the client gone
        # (issue 47, item 5), and nothing reaches it under its id meanwhile.
        steal()
    finally:
        context.destroy(linger=0)
    with plain_cluster.admin() as admin:
        assert not [r for r in admin.sessions() if r["id"] == f"{0x7A4E:#018x}"]
