"""The registry of a broker with a peer (``broker.pair`` in ``broker.registry``): knocks are
refused while passive, served once the pair says so, and a step down lets everything go."""

from __future__ import annotations

import pytest

from fabric.broker.model import Side
from fabric.broker.pair import Beat, Pair, State
from fabric.core.errors import BrokerPassive, HandshakeError, SessionLost, error_from_wire
from fabric.core.protocol import Kind

from test_registry import (A, C1, CLIENT_TOKEN, decoded, frames, hello, make_registry,
                           open_session, register_frames, rejected)

pytestmark = pytest.mark.timeout(60)

BOUND = 2.0


def passive_backup(registry) -> Pair:
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)
    registry.pair.on_peer(Beat(State.ACTIVE, 1, True), now=0.0)
    return registry.pair


def test_a_passive_broker_refuses_hellos_device_lists_and_registrations():
    registry = make_registry((A, "a", 1))
    passive_backup(registry)
    _, error = rejected(hello(registry, C1, 0x11, now=0.5), C1, BrokerPassive)
    assert error.details["refused"] == "session" and "Try the other broker" in error.message
    rejected(registry.from_client(C1, frames(Kind.DEVICES, 0, 2, {"token": CLIENT_TOKEN}),
                                  0.5), C1, BrokerPassive)
    [send] = registry.from_worker(b"worker-x", register_frames("x", [{"n": 0}]), 0.5)
    assert decoded(send).kind == Kind.REJECT
    assert isinstance(error_from_wire(decoded(send).body), BrokerPassive)
    assert registry.rejects["broker_passive"] == 3


def test_a_passive_broker_takes_over_at_a_knock_past_the_bound_and_says_it_is_settling():
    registry = make_registry()
    pair = passive_backup(registry)
    _, error = rejected(hello(registry, C1, 0x11, now=BOUND), C1, HandshakeError)
    assert pair.serving and pair.takeovers == 1
    assert error.details["settling"] is True and "retry in a moment" in error.message
    # Its workers register, and the next HELLO opens a session.
    registry.from_worker(A, register_frames("a", [{"n": 0}]), BOUND + 0.5)
    open_session(registry, C1, 0x12, now=BOUND + 0.6)


def test_a_step_down_lets_the_workers_go_and_ends_the_sessions():
    registry = make_registry((A, "a", 1))
    registry.pair = Pair(primary=True, heartbeat=1.0, liveness=2, now=0.0)
    registry.pair.on_peer(Beat(State.BACKUP, 0, False), now=0.0)
    open_session(registry, C1, 0x11, now=0.1)
    assert registry.pair.on_peer(Beat(State.ACTIVE, 5, False), now=0.2).stepped_down
    sends = registry.step_down()
    to_worker = [s for s in sends if s.side is Side.WORKERS and s.identity == A]
    assert isinstance(error_from_wire(decoded(to_worker[0]).body), BrokerPassive)
    to_client = [s for s in sends if s.side is Side.FRONTEND]
    assert isinstance(error_from_wire(decoded(to_client[0]).body), SessionLost)
    assert not registry.workers and not registry.sessions


def test_the_metrics_show_the_pairs_state_term_and_takeovers():
    from fabric.broker.metrics import families, figures

    registry = make_registry()
    pair = passive_backup(registry)
    hello(registry, C1, 0x11, now=BOUND + 0.5)  # the takeover, 2.5 s after the primary's beat
    assert pair.takeover_wait == pytest.approx(BOUND + 0.5)
    samples = {(sample.name, tuple(sample.labels.values())): sample.value
               for family in families(figures(registry, BOUND + 1.0, 0))
               for sample in family.samples}
    assert samples[("fabric_pair_state", ("active",))] == 1.0
    assert samples[("fabric_pair_state", ("passive",))] == 0.0
    assert samples[("fabric_pair_term", ())] == 2
    assert samples[("fabric_pair_takeovers_total", ())] == 1
    assert samples[("fabric_pair_takeover_wait_seconds", ())] == pytest.approx(BOUND + 0.5)


def test_a_broker_without_a_peer_has_no_pair_metrics():
    from fabric.broker.metrics import families, figures

    names = {family.name for family in families(figures(make_registry(), 1.0, 0))}
    assert not any(name.startswith("fabric_pair") for name in names)
