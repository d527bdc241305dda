"""Liveness tells busy from dead, sans I/O on a fake clock (issue 41): the broker and the
worker's control machine end a link only when its connection is gone, never for a peer that
only says nothing; the link's beacon carries libzmq's ZMTP heartbeats, whose bounds follow
``--heartbeat`` and ``--liveness``, and REGISTER waits for it. Real processes:
``test_liveness.py``.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
import zmq

import fabric
from fabric.broker.model import Limits, Side
from fabric.broker.registry import Registry
from fabric.core import protocol
from fabric.core.errors import ProtocolError
from fabric.core.protocol import Kind, Message
from fabric.workers.control import Connect, Control, zmtp_heartbeats

HEARTBEAT, LIVENESS = 1.0, 3
BROKER = "tcp://127.0.0.1:5555"
REGISTRATION = {"token": "t", "name": "w", "backend": "numpy",
                "devices": [{"backend": "numpy"}], "max_message_bytes": 1 << 20}
A, LANE_A, BEACON_A = b"worker-a", b"lane-a", b"beacon-a"


def control() -> Control:
    counter = itertools.count(1)
    return Control(dict(REGISTRATION), broker=BROKER, encrypted=False, heartbeat=HEARTBEAT,
                   liveness=LIVENESS, new_identity=lambda: b"id-%d" % next(counter),
                   host_not_resolving=lambda address: None)


def frames(kind: Kind, body: dict[str, Any] | None = None) -> list[Any]:
    return protocol.encode(Message(kind, 0, 0, body or {}))


def registered(machine: Control, now: float) -> None:
    """Its beacon up, REGISTER sent, REGISTERED heard, by ``now``."""
    machine.on_beacon_up(now - 0.5)
    assert [a.message.kind for a in machine.tick(now - 0.2)] == [Kind.REGISTER]
    machine.on_message(frames(Kind.REGISTERED, {"server": "b", "heartbeat": HEARTBEAT}), now)


# -- the worker's side ------------------------------------------------------------------------


def test_the_beacon_pings_often_and_gives_the_link_liveness_heartbeats():
    assert zmtp_heartbeats(1.0, 3) == {zmq.HEARTBEAT_IVL: 100, zmq.HEARTBEAT_TTL: 3000,
                                       zmq.HEARTBEAT_TIMEOUT: 3000}
    assert zmtp_heartbeats(0.05, 3) == {zmq.HEARTBEAT_IVL: 50, zmq.HEARTBEAT_TTL: 150,
                                        zmq.HEARTBEAT_TIMEOUT: 150}
    # libzmq sends the TTL in deciseconds over 16 bits: a longer bound is held to its most.
    assert zmtp_heartbeats(1000.0, 10)[zmq.HEARTBEAT_TTL] == 6_553_500


def test_a_registered_worker_waits_for_a_silent_broker_however_long():
    machine = control()
    machine.start(0.0)
    registered(machine, 0.6)
    for now in range(2, 100):  # 32 liveness windows without a word: busy, not gone
        assert [a.message.kind for a in machine.tick(float(now))] == [Kind.HEARTBEAT]


def test_a_closed_link_is_left_for_a_new_connection_once_registered(caplog):
    machine = control()
    machine.start(0.0)
    assert machine.on_disconnected(0.5) == []  # before REGISTERED: libzmq connects again
    registered(machine, 1.0)
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        actions = machine.on_disconnected(2.0)
    assert actions == [Connect(b"id-5", (b"id-4",), b"id-6")]  # all new identities
    assert "closed (the broker ended, or its link was silent for 3 s); reconnecting" \
        in caplog.text
    machine.on_beacon_up(2.1)
    [register] = machine.tick(2.31)
    assert register.message.body["beacon"] == b"id-6"
    # The new connection is not registered yet: its own close is libzmq's to retry, and a
    # broker silent on it past the window is left for yet another.
    assert machine.on_disconnected(2.5) == []
    assert type(machine.tick(5.01)[0]) is Connect


def test_a_broker_that_forgot_the_worker_is_registered_with_again_and_waited_for_meanwhile():
    machine = control()
    machine.start(0.0)
    registered(machine, 0.6)
    unknown = ProtocolError("This worker is not registered.", reason="not_registered")
    [again] = machine.on_message(frames(Kind.ERROR, unknown.to_wire()), 1.0)
    assert again.message.kind == Kind.REGISTER
    assert type(machine.tick(4.01)[0]) is Connect  # unregistered: silence counts again


# -- the broker's side ------------------------------------------------------------------------


def registry_with_a_worker() -> Registry:
    registry = Registry(client_token="c", worker_token="w", limits=Limits(heartbeat=1.0),
                        now=0.0)
    body = {"token": "w", "name": "a", "backend": "numpy", "devices": [{}],
            "max_message_bytes": 1 << 20, "fabric_version": fabric.__version__,
            "lanes": [LANE_A], "beacon": BEACON_A}
    registry.from_worker(A, protocol.encode(Message(Kind.REGISTER, body=body)), 0.0)
    registry.from_worker(LANE_A, frames(Kind.HEARTBEAT), 0.0)  # the lane attached
    return registry


def sent_to(sends: list[Any]) -> list[tuple[bytes, Kind]]:
    return [(s.identity, protocol.decode(s.frames).kind) for s in sends]


def test_the_broker_never_loses_a_worker_that_only_says_nothing():
    registry = registry_with_a_worker()
    for tick in range(1, 400):  # 100 s of silence, four scans a heartbeat
        now = tick / 4
        assert {kind for _, kind in sent_to(registry.tick(now))} <= {Kind.HEARTBEAT}
    assert list(registry.workers) == [A]


def test_every_heartbeat_round_asks_the_beacons_and_a_closed_connection_asks_them_at_once():
    registry = registry_with_a_worker()
    assert sent_to(registry.tick(0.0)) == [(A, Kind.HEARTBEAT), (LANE_A, Kind.HEARTBEAT),
                                           (BEACON_A, Kind.HEARTBEAT)]
    registry.connection_closed(0.1)  # the monitor: some connection on the workers socket closed
    assert registry.next_deadline() == pytest.approx(0.25)  # a scan after the last round
    assert sent_to(registry.tick(0.25)) == [(BEACON_A, Kind.HEARTBEAT)]  # the beacon alone
    registry.connection_closed(0.3)
    registry.connection_closed(0.31)  # many closes: one probe
    assert registry.next_deadline() == pytest.approx(0.5)
    assert sent_to(registry.tick(0.5)) == [(BEACON_A, Kind.HEARTBEAT)]
    assert sent_to(registry.tick(0.75)) == []
    # The probe found the beacon unroutable: the worker is lost, and says so.
    assert list(registry.workers) == [A]
    [] = registry.unroutable(Side.WORKERS, BEACON_A, 0.76)  # (no session to tell)
    assert registry.workers == {} and registry.counters["workers_lost"] == 1
    assert registry.worker_table.beacon_owner == {}


def test_a_beacon_must_be_a_fresh_routing_identity():
    registry = registry_with_a_worker()
    body = {"token": "w", "name": "b", "backend": "numpy", "devices": [{}],
            "max_message_bytes": 1 << 20, "fabric_version": fabric.__version__,
            "lanes": [b"lane-b"]}
    for beacon in (BEACON_A, LANE_A, A, b"lane-b", b"\0zero", 7):  # taken, its own lane, bad
        sends = registry.from_worker(b"worker-b", protocol.encode(Message(
            Kind.REGISTER, body={**body, "beacon": beacon})), 1.0)
        assert sent_to(sends) == [(b"worker-b", Kind.ERROR)], beacon
    sends = registry.from_worker(b"worker-b", protocol.encode(Message(
        Kind.REGISTER, body={**body, "beacon": b"beacon-b"})), 1.0)
    assert sent_to(sends) == [(b"worker-b", Kind.REGISTERED)]
