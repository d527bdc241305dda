"""Sans-I/O tests of the worker's control machine (``fabric.workers.control``), on a fake clock:
registration, heartbeats, a silent broker, refusals and failed security handshakes, without
sockets or processes."""

from __future__ import annotations

import errno
import itertools
import logging
from typing import Any

import pytest
import zmq
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fabric.core import protocol
from fabric.core.errors import (AuthenticationError, BrokerPassive, ProtocolError,
                                VersionMismatch, WorkerNameTaken, WrongPort)
from fabric.core.protocol import Kind, Message
from fabric.workers.control import (Attach, BrokerSilent, ClientPortReached, Connect, Control,
                                    Probe, RegistrationRefused, Send, ping_interval)

HEARTBEAT, LIVENESS = 1.0, 3
BROKER = "tcp://127.0.0.1:5555"
REGISTRATION = {"token": "t", "name": "w", "backend": "numpy",
                "devices": [{"backend": "numpy"}, {"backend": "numpy"}],
                "max_message_bytes": 1 << 20}


def control(encrypted: bool = False, **options: Any) -> Control:
    """A machine whose identities are numbered, so every one is new and tests can name them;
    its broker's host name resolves unless ``options`` say otherwise."""
    counter = itertools.count(1)
    return Control(dict(REGISTRATION), encrypted=encrypted, heartbeat=HEARTBEAT,
                   liveness=LIVENESS, new_identity=lambda: b"id-%d" % next(counter),
                   **{"broker": BROKER, "host_not_resolving": lambda address: None, **options})


def frames(kind: Kind, body: dict[str, Any] | None = None, session: int = 0) -> list[Any]:
    return protocol.encode(Message(kind, session, 0, body or {}))


def sent(actions: list[Any]) -> list[Kind]:
    return [a.message.kind for a in actions if type(a) is Send]


def registering(machine: Control, now: float) -> list[Any]:
    """What a connection made at ``now`` does until REGISTER: [Connect, Send(REGISTER)]
    (its beacon up at once, REGISTER two PINGs later)."""
    connecting = machine.tick(now) if machine.lanes else machine.start(now)
    assert [type(a) for a in connecting] == [Connect]
    assert machine.on_beacon_up(now) == []
    return connecting + machine.tick(now + 2 * ping_interval(HEARTBEAT))


def test_start_connects_under_new_identities_and_registers_every_lane():
    machine = control()
    [connect] = machine.start(0.0)
    assert connect == Connect(b"id-3", (b"id-1", b"id-2"), b"id-4")
    assert machine.tick(0.05) == []  # nothing before the link's beacon is up
    assert machine.on_beacon_up(0.1) == []
    assert machine.tick(0.29) == []  # two of its PINGs first, 0.1 s apart
    [register] = machine.tick(0.31)
    assert type(register) is Send and register.message.kind == Kind.REGISTER
    assert register.message.body == {**REGISTRATION, "lanes": [b"id-1", b"id-2"],
                                     "beacon": b"id-4", "instance": machine.instance}
    assert len(machine.instance) == 16
    assert machine.on_beacon_up(0.4) == [] and machine.tick(0.9) == []  # sent once


def test_heartbeats_are_sent_every_heartbeat_and_not_between():
    machine = control()
    registering(machine, 0.0)  # REGISTER at 0.2: the heartbeats count from there
    assert machine.tick(0.7) == []
    assert sent(machine.tick(1.25)) == [Kind.HEARTBEAT]
    assert machine.tick(2.2) == []
    assert sent(machine.tick(2.25)) == [Kind.HEARTBEAT]
    assert machine.tick_every == 0.1  # the loop looks at least this often


def test_a_broker_silent_past_liveness_heartbeats_is_left_for_a_new_connection():
    machine = control()
    machine.start(0.0)
    machine.on_message(frames(Kind.HEARTBEAT), 2.0)  # heard: alive until 2 + 3
    assert Connect not in map(type, machine.tick(5.0))
    actions = registering(machine, 5.01)
    assert [type(a) for a in actions] == [Connect, Send]
    assert actions[0] == Connect(b"id-7", (b"id-5", b"id-6"), b"id-8")  # all new
    assert actions[1].message.body["lanes"] == [b"id-5", b"id-6"]
    assert actions[1].message.body["beacon"] == b"id-8"
    assert actions[1].message.body["instance"] == machine.instance  # the same process
    assert Connect not in map(type, machine.tick(8.0))  # silence counts from the reconnection


PAIR = "tcp://a:5556,tcp://b:5556"


def test_a_pairs_passive_broker_moves_the_worker_on_to_the_other():
    machine = control(broker=PAIR)
    machine.start(0.0)
    assert machine.broker == "tcp://a:5556"
    refusal = protocol.encode(protocol.error_message(BrokerPassive("passive"),
                                                     kind=Kind.REJECT))
    [connect] = machine.on_message(refusal, 0.5)
    assert type(connect) is Connect and machine.broker == "tcp://b:5556"
    machine.on_message(refusal, 0.7)
    assert machine.broker == "tcp://a:5556"  # and round again


def test_a_silent_broker_of_a_pair_is_left_for_the_other_after_a_heartbeat():
    machine = control(broker=PAIR)
    machine.start(0.0)  # (a dead broker: nothing answers, no beacon)
    assert machine.tick(HEARTBEAT) == []
    [connect] = machine.tick(HEARTBEAT + 0.01)
    assert type(connect) is Connect and machine.broker == "tcp://b:5556"


def test_a_pair_broker_that_shows_it_lives_is_waited_for_through_its_registration():
    machine = control(broker=PAIR)
    machine.start(0.0)
    machine.on_beacon_up(0.9)  # (slow, but up: it lives)
    assert machine.tick(1.05) == []
    assert sent(machine.tick(1.11)) == [Kind.REGISTER]
    assert machine.tick(2.0) == []  # its answer is awaited a heartbeat
    [connect] = machine.tick(2.12)
    assert type(connect) is Connect and machine.broker == "tcp://b:5556"


def test_a_registered_worker_whose_pair_broker_ends_turns_to_the_other():
    machine = control(broker=PAIR)
    registering(machine, 0.0)
    machine.on_message(frames(Kind.REGISTERED, {"server": "a", "heartbeat": 1.0}), 0.3)
    [connect] = machine.on_disconnected(1.0)
    assert type(connect) is Connect and machine.broker == "tcp://b:5556"


def test_a_single_broker_is_never_left():
    machine = control()
    machine.start(0.0)
    machine.on_message(protocol.encode(protocol.error_message(BrokerPassive("passive"),
                                                              kind=Kind.REJECT)), 0.5)
    assert machine.broker == BROKER


def test_anything_heard_shows_the_broker_lives_even_a_bad_or_misdirected_message(caplog):
    machine = control()
    machine.start(0.0)
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert machine.on_message([b"not a header"], 2.5) == []
        assert machine.on_message(frames(Kind.REPLY, session=7), 2.9) == []
    assert "bad message from the broker" in caplog.text
    assert "came on the worker's own socket" in caplog.text
    assert Connect not in map(type, machine.tick(5.5))


def test_registered_attaches_the_lanes_with_the_brokers_limit_or_ours():
    machine = control()
    machine.start(0.0)
    assert machine.on_message(frames(Kind.REGISTERED, {"server": "b", "heartbeat": 1.0,
                                                      "max_message_bytes": 4096}),
                              0.1) == [Attach(4096)]
    for bad in (0, -1, "big", None):
        assert machine.on_message(frames(Kind.REGISTERED, {"server": "b", "heartbeat": 1.0,
                                                           "max_message_bytes": bad}),
                                  0.2) == [Attach(1 << 20)]


@pytest.mark.parametrize("error", [AuthenticationError("refused the worker token"),
                                   VersionMismatch("speaks version 1")])
def test_a_refused_token_or_version_stops_the_worker(error):
    machine = control()
    machine.start(0.0)
    with pytest.raises(RegistrationRefused, match=error.message):
        machine.on_message(frames(Kind.REJECT, error.to_wire()), 0.1)


def test_the_broker_s_client_port_reached_stops_the_worker_as_a_usage_error():
    machine = control()
    machine.start(0.0)
    wrong = WrongPort("This worker reached the broker's client port (fabric broker "
                      "--frontend): start it with --broker set to ...", port="clients")
    with pytest.raises(ClientPortReached, match="reached the broker's client port") as info:
        machine.on_message(frames(Kind.REJECT, wrong.to_wire()), 0.1)
    assert info.value.exit_code == 2 and BROKER in str(info.value)


def test_a_silent_broker_is_named_with_why_its_name_may_not_resolve(caplog):
    said = "The host name 'brokr' in tcp://brokr:5556 does not resolve: check its spelling."
    machine = control(host_not_resolving=lambda address: said)
    machine.start(0.0)
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert [type(a) for a in machine.tick(3.5)] == [Connect]  # a new connection
    assert f"the broker at {BROKER} has been silent for 3.5 s; reconnecting. {said}" \
        in caplog.text


def test_without_give_up_after_a_silent_broker_is_retried_forever():
    # "Forever" on the fake clock: a loop's ticks (one a second) through 10,000 silent seconds.
    # Every time the broker has been silent past the liveness bound the worker connects again,
    # under new identities, and registers again once its beacon is up; the last attempt comes
    # as the first did, one period after the one before, and none raises.
    machine = control()
    machine.start(0.0)
    attempts, registered, identities, lanes = [], [], set(), None
    for now in range(1, 10_001):
        actions = machine.tick(float(now))
        if actions and type(actions[0]) is Connect:
            (connect,) = actions
            identities.update((connect.identity, connect.beacon, *connect.lanes))
            attempts.append(now)
            lanes = list(connect.lanes)
            assert machine.on_beacon_up(float(now)) == []  # (REGISTER follows at a tick)
        elif sent(actions) == [Kind.REGISTER]:
            assert actions[0].message.body["lanes"] == lanes
            registered.append(now)
        else:  # between attempts: heartbeats only
            assert sent(actions) in ([], [Kind.HEARTBEAT]), now
    # (the first tick past 3 heartbeats of silence: every 4 s, the first at 4)
    assert {later - earlier for earlier, later in zip([0, *attempts], attempts)} == {4}
    assert len(attempts) == 2_500 and attempts[-1] == 10_000
    assert len(registered) >= len(attempts) - 1  # (each attempt registers again)
    assert len(identities) == 4 * len(attempts)  # (worker, beacon, 2 lanes: never reused)


def test_give_up_after_stops_a_worker_whose_broker_stays_silent():
    machine = control(give_up_after=10.0)
    machine.start(0.0)
    machine.tick(3.5)  # reconnects meanwhile
    machine.on_message(frames(Kind.HEARTBEAT), 5.0)  # heard: the bound starts again
    machine.tick(9.0)
    assert [type(a) for a in machine.tick(15.0)] == [Connect]  # silent 10 s: not past it
    with pytest.raises(BrokerSilent) as info:
        machine.tick(15.01)
    assert info.value.exit_code == 1
    assert f"The broker at {BROKER} has said nothing for 10.0 s (--give-up-after 10)" \
        in str(info.value)


def test_a_broker_that_does_not_know_the_worker_gets_its_registration_again(caplog):
    machine = control()
    _, first = registering(machine, 0.0)
    unknown = ProtocolError("This worker is not registered.", reason="not_registered")
    [again] = machine.on_message(frames(Kind.ERROR, unknown.to_wire()), 0.1)
    assert again.message.body == first.message.body  # the same lanes: no new connection
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert machine.on_message(frames(Kind.ERROR, ProtocolError("odd").to_wire()), 0.2) == []
    assert "the broker reported: odd" in caplog.text


def test_a_name_held_by_a_live_worker_is_retried_past_the_liveness_bound_then_stops(caplog):
    machine = control()
    machine.start(0.0)
    taken = frames(Kind.REJECT, WorkerNameTaken("Worker name 'w' belongs to a live worker: "
                                                "give this worker another --name.",
                                                worker="w", alive_for=3.0).to_wire())
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert machine.on_message(taken, 0.0) == []  # perhaps our own previous process
    assert "Trying again for 4.0 s" in caplog.text
    not_registered = frames(Kind.ERROR, ProtocolError("x", reason="not_registered").to_wire())
    assert sent(machine.on_message(not_registered, 1.0)) == [Kind.REGISTER]
    assert machine.on_message(taken, 4.0) == []  # still within 3 s + one heartbeat
    with pytest.raises(RegistrationRefused, match="another --name"):
        machine.on_message(taken, 4.01)


def test_a_worker_registered_after_a_name_refusal_starts_counting_afresh():
    machine = control()
    machine.start(0.0)
    taken = frames(Kind.REJECT, WorkerNameTaken("taken", alive_for=3.0).to_wire())
    machine.on_message(taken, 0.0)
    machine.on_message(frames(Kind.REGISTERED, {"server": "b", "heartbeat": 1.0}), 1.0)
    assert machine.on_message(taken, 10.0) == []  # registered meanwhile: a new bound starts


def test_a_refused_curve_key_stops_the_worker():
    machine = control(encrypted=True)
    machine.start(0.0)
    with pytest.raises(RegistrationRefused, match="refused this connection's CURVE key"):
        machine.on_handshake_failed(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)


def test_a_cut_handshake_is_explained_by_a_probe_the_loop_makes():
    machine = control(encrypted=True)
    machine.start(0.0)
    event = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    assert machine.on_handshake_failed(event, errno.EAGAIN) == []  # a timeout: no probe
    assert machine.on_handshake_failed(event, errno.ECONNRESET) == [
        Probe(event, errno.ECONNRESET)]
    assert machine.on_probe(event, errno.ECONNRESET, None) == []  # nothing learned
    with pytest.raises(RegistrationRefused, match="the peer at .* does not"):
        machine.on_probe(event, errno.ECONNRESET, "NULL")  # encryption at one end only


def test_a_handshake_failure_retrying_may_fix_is_explained_once_per_connection(caplog):
    machine = control(encrypted=True)
    machine.start(0.0)
    event = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert machine.on_probe(event, errno.ECONNRESET, "CURVE") == []
        assert machine.on_handshake_failed(event, errno.ECONNRESET) == []  # said already
        assert machine.on_handshake_failed(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0x11) == []
    assert caplog.text.count("likely not its key") == 1
    assert "protocol error" not in caplog.text
    machine.tick(10.0)  # silent: a new connection, where it is explained again
    assert machine.on_handshake_failed(event, errno.ECONNRESET) == [
        Probe(event, errno.ECONNRESET)]


class ControlOnAFakeClock(RuleBasedStateMachine):
    """Any interleaving of time passing, broker messages, beacons coming up and ticks: the
    machine (never registered here) reconnects exactly when the broker was silent past
    liveness heartbeats, registers each connection's own, new lanes and beacon two PINGs
    after its beacon is up and not before, then says HEARTBEAT on time."""

    @initialize()
    def start(self) -> None:
        self.machine = control()
        self.now = 0.0
        self.heard = 0.0  # when the broker was last heard, or the last connection began
        self.heartbeat_sent = 0.0
        self.identities: set[bytes] = set()
        self._check(self.machine.start(self.now), connecting=True)

    def _check(self, actions: list[Any], connecting: bool) -> None:
        kinds = [type(a) for a in actions]
        if not connecting:
            assert Connect not in kinds
            return
        assert kinds == [Connect]
        [self.connect] = actions
        fresh = {self.connect.identity, *self.connect.lanes, self.connect.beacon}
        assert len(fresh) == 4 and not fresh & self.identities  # all new
        self.identities |= fresh
        self.register_due: float | None = None  # its beacon is not up yet
        self.registering = True

    @rule()
    def beacon_up(self) -> None:
        assert self.machine.on_beacon_up(self.now) == []
        if self.registering and self.register_due is None:
            self.register_due = self.now + 2 * ping_interval(HEARTBEAT)

    @rule(dt=st.floats(0.0, 2.0 * HEARTBEAT * LIVENESS))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(kind=st.sampled_from([Kind.HEARTBEAT, Kind.PONG]))
    def broker_speaks(self, kind: Kind) -> None:
        assert self.machine.on_message(frames(kind), self.now) == []
        self.heard = self.now

    @rule()
    def tick(self) -> None:
        actions = self.machine.tick(self.now)
        silent = self.now - self.heard > HEARTBEAT * LIVENESS
        self._check(actions, connecting=silent)
        if silent:
            self.heard = self.now
        elif self.registering:
            if self.register_due is None or self.now < self.register_due:
                assert actions == []
                return
            assert sent(actions) == [Kind.REGISTER]
            body = actions[0].message.body
            assert body["lanes"] == list(self.connect.lanes)
            assert body["beacon"] == self.connect.beacon
            self.registering = False
            self.heartbeat_sent = self.now  # (the heartbeats count from REGISTER)
        elif self.now - self.heartbeat_sent >= HEARTBEAT:
            assert sent(actions) == [Kind.HEARTBEAT]
            self.heartbeat_sent = self.now
        else:
            assert actions == []

    @invariant()
    def lanes_are_the_last_connections(self) -> None:
        assert len(self.machine.lanes) == len(REGISTRATION["devices"])


TestControlOnAFakeClock = ControlOnAFakeClock.TestCase
TestControlOnAFakeClock.settings = settings(max_examples=60, stateful_step_count=30,
                                            deadline=None)

