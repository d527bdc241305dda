"""The broker pair's state machine (``broker.pair``): every transition, and no split brain."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fabric.broker.pair import Beat, Pair, State, refusal
from fabric.core.errors import BrokerPassive, ConfigError, error_from_wire

pytestmark = pytest.mark.timeout(60)

HEARTBEAT, LIVENESS = 1.0, 3
BOUND = HEARTBEAT * LIVENESS


def machine(primary: bool, now: float = 0.0) -> Pair:
    return Pair(primary=primary, heartbeat=HEARTBEAT, liveness=LIVENESS, now=now)


def beat(state: State, *, primary: bool, term: int = 0) -> Beat:
    return Beat(state, term, primary)


def in_state(state: State, *, primary: bool, term: int = 1) -> Pair:
    pair = machine(primary)
    pair.state, pair.term = state, term
    return pair


# -- the table, state by state -------------------------------------------------------------

@pytest.mark.parametrize("heard, after", [
    (State.BACKUP, State.ACTIVE), (State.ACTIVE, State.PASSIVE),
    (State.PASSIVE, State.PRIMARY)])
def test_a_starting_primary_follows_what_the_backup_says(heard, after):
    pair = machine(primary=True)
    pair.on_peer(beat(heard, primary=False, term=1), now=0.5)
    assert pair.state is after


@pytest.mark.parametrize("heard, after", [
    (State.PRIMARY, State.BACKUP), (State.ACTIVE, State.PASSIVE),
    (State.PASSIVE, State.BACKUP)])
def test_a_starting_backup_goes_passive_only_under_an_active_primary(heard, after):
    pair = machine(primary=False)
    pair.on_peer(beat(heard, primary=True, term=1), now=0.5)
    assert pair.state is after


def test_a_starting_primary_serves_a_knock_only_after_the_bound_without_its_backup():
    pair = machine(primary=True)
    assert not pair.on_request(now=BOUND - 0.1)
    assert pair.state is State.PRIMARY
    assert pair.on_request(now=BOUND)
    assert pair.state is State.ACTIVE and pair.term == 1
    assert pair.takeovers == 0  # (no peer was serving)


def test_a_starting_backup_never_serves_a_knock():
    pair = machine(primary=False)
    assert not pair.on_request(now=100 * BOUND)
    assert pair.state is State.BACKUP


@pytest.mark.parametrize("heard", [State.PRIMARY, State.BACKUP, State.PASSIVE])
def test_an_active_broker_stays_active_whatever_else_the_peer_says(heard):
    pair = in_state(State.ACTIVE, primary=True)
    assert pair.on_peer(beat(heard, primary=False, term=5), now=1.0) is None
    assert pair.serving


@pytest.mark.parametrize("mine, theirs, steps_down", [(1, 2, True), (2, 1, False)])
def test_of_two_actives_the_older_term_steps_down(mine, theirs, steps_down):
    pair = in_state(State.ACTIVE, primary=True, term=mine)
    change = pair.on_peer(beat(State.ACTIVE, primary=False, term=theirs), now=1.0)
    assert (change is not None and change.stepped_down) is steps_down
    assert pair.serving is not steps_down


def test_of_two_actives_with_one_term_the_backup_steps_down():
    primary = in_state(State.ACTIVE, primary=True, term=3)
    backup = in_state(State.ACTIVE, primary=False, term=3)
    assert primary.on_peer(backup.beat(), now=1.0) is None
    assert backup.on_peer(primary.beat(), now=1.0).stepped_down


@pytest.mark.parametrize("heard", [State.PRIMARY, State.BACKUP])
def test_a_passive_broker_serves_when_its_peer_restarts(heard):
    pair = in_state(State.PASSIVE, primary=False, term=1)
    pair.on_peer(beat(heard, primary=True), now=1.0)
    assert pair.serving and pair.term == 2


def test_two_passives_make_the_primary_active():
    primary, backup = in_state(State.PASSIVE, primary=True), in_state(State.PASSIVE,
                                                                      primary=False)
    primary.on_peer(backup.beat(), now=1.0)
    backup.on_peer(primary.beat(), now=1.0)
    assert primary.serving and not backup.serving
    backup.on_peer(primary.beat(), now=1.1)
    assert backup.state is State.PASSIVE


def test_a_passive_broker_stays_passive_under_an_active_peer():
    pair = in_state(State.PASSIVE, primary=False)
    assert pair.on_peer(beat(State.ACTIVE, primary=True), now=1.0) is None
    assert not pair.serving


def test_the_backup_takes_over_only_on_a_knock_after_the_primary_is_silent_past_the_bound():
    backup = machine(primary=False)
    backup.on_peer(beat(State.ACTIVE, primary=True, term=1), now=1.0)
    assert backup.state is State.PASSIVE
    assert not backup.on_request(now=1.0 + BOUND - 0.01)  # the primary may still live
    # Silent past the bound, but nobody knocks: nothing changes (a cut link alone).
    assert backup.state is State.PASSIVE
    assert backup.on_request(now=1.0 + BOUND)
    assert backup.serving and backup.term == 2 and backup.takeovers == 1


def test_each_heartbeat_pushes_the_peers_expiry_on():
    backup = machine(primary=False)
    for now in (1.0, 3.0, 5.0):
        backup.on_peer(beat(State.ACTIVE, primary=True, term=1), now=now)
    assert not backup.on_request(now=5.0 + BOUND - 0.01)
    assert backup.peer_silent_for(5.0 + 1.0) == pytest.approx(1.0)


def test_a_resumed_primary_steps_down_under_the_backup_that_took_over():
    primary, backup = machine(primary=True), machine(primary=False)
    backup.on_peer(primary.beat(), now=0.1)
    primary.on_peer(backup.beat(), now=0.1)  # the backup heard: the primary goes active
    backup.on_peer(primary.beat(), now=0.2)
    assert primary.serving and backup.state is State.PASSIVE
    # The primary is stopped (SIGSTOP): silent; a worker knocks at the backup.
    assert backup.on_request(now=0.2 + BOUND)
    # Resumed, the primary hears the newer active and steps down.
    change = primary.on_peer(backup.beat(), now=10.0)
    assert change.stepped_down and not primary.serving
    assert backup.on_peer(primary.beat(), now=10.1) is None and backup.serving


def test_a_peer_with_the_same_role_is_a_configuration_error():
    pair = machine(primary=True)
    with pytest.raises(ConfigError, match="--primary and the other with --backup"):
        pair.on_peer(beat(State.PRIMARY, primary=True), now=0.1)


@pytest.mark.parametrize("body", [
    None, [], {"state": "active"}, {"state": "ruling", "term": 1, "primary": True},
    {"state": "active", "term": -1, "primary": True},
    {"state": "active", "term": 1.0, "primary": True},
    {"state": "active", "term": 2**70, "primary": True},
    {"state": "active", "term": 1, "primary": 1}])
def test_a_malformed_beat_is_none(body):
    assert Beat.from_wire(body) is None


def test_a_beat_survives_the_wire():
    sent = Beat(State.PASSIVE, 7, False)
    assert Beat.from_wire(sent.to_wire()) == sent


def test_the_refusal_is_typed_and_survives_the_wire():
    error = refusal(machine(primary=False), "session")
    again = error_from_wire(error.to_wire())
    assert isinstance(again, BrokerPassive)
    assert "Try the other broker" in again.message
    assert again.details == {"state": "backup", "refused": "session"}


# -- no split brain: two machines, a link that may be cut, a clock and knocks ----------------

STEPS = st.lists(st.one_of(
    st.tuples(st.just("a_hears_b")), st.tuples(st.just("b_hears_a")),
    st.tuples(st.just("cut")), st.tuples(st.just("mend")),
    st.tuples(st.just("knock_a")), st.tuples(st.just("knock_b")),
    st.tuples(st.just("restart_a")), st.tuples(st.just("restart_b")),
    st.tuples(st.just("wait"), st.floats(0.0, 2 * BOUND))), max_size=60)


@settings(max_examples=400, deadline=None)
@given(STEPS)
def test_no_events_make_two_actives_that_hear_each_other(steps):
    """Whatever happened (heartbeats lost or heard, a cut link, knocks, restarts, time),
    once the link is up and each has heard the other a few times, at most one serves."""
    now, linked = 0.0, True
    a, b = machine(primary=True), machine(primary=False)
    for step in steps:
        kind = step[0]
        if kind == "wait":
            now += step[1]
        elif kind in ("cut", "mend"):
            linked = kind == "mend"
        elif kind == "a_hears_b" and linked:
            a.on_peer(b.beat(), now)
        elif kind == "b_hears_a" and linked:
            b.on_peer(a.beat(), now)
        elif kind == "knock_a":
            a.on_request(now)
        elif kind == "knock_b":
            b.on_request(now)
        elif kind == "restart_a":
            a = machine(primary=True, now=now)
        elif kind == "restart_b":
            b = machine(primary=False, now=now)
    for _ in range(3):  # the link is up: heartbeats flow both ways, with knocks between
        a.on_peer(b.beat(), now)
        b.on_peer(a.beat(), now)
        a.on_request(now)
        b.on_request(now)
        assert not (a.serving and b.serving)
    assert a.serving or b.serving or (a.state is State.PRIMARY and b.state is State.BACKUP)
