"""The broker's flow control (``broker.backpressure``), sans I/O, on a fake clock.

A real registry (built with test_registry's helpers) answers the cuts and losses; the
"sockets" are a fake send function whose peers take a set number of messages, or are not
there. What the process-level tests in test_limits.py show end to end (a client that stops
reading is cut, a worker that stops reading pauses the frontend until it is lost) is checked
here event by event, and a hypothesis state machine checks the rules hold in any order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_registry import A, B, C1, C2, decoded, frames, make_registry, open_session

from fabric.broker.backpressure import FlowControl, PeerUnreachable
from fabric.broker.model import Limits, Send, Side
from fabric.core.errors import SessionLost, error_from_wire
from fabric.core.protocol import Kind

LIMITS = Limits(heartbeat=1.0, peer_queue=4, slow_peer_timeout=0.5)
WORKER_A, CLIENT_1 = (Side.WORKERS, A), (Side.FRONTEND, C1)


class FakePeers:
    """The loop's send function: each peer takes ``room[peer]`` more messages (0: its queue
    is full; absent: it is not there) and keeps what it took."""

    def __init__(self) -> None:
        self.room: dict[tuple[Side, bytes], int] = {}
        self.taken: dict[tuple[Side, bytes], list] = {}

    def __call__(self, peer: tuple[Side, bytes], message: list) -> bool:
        if peer not in self.room:
            raise PeerUnreachable
        if self.room[peer] == 0:
            return False
        self.room[peer] -= 1
        self.taken.setdefault(peer, []).append(message)
        return True


def setup():
    """Worker a (device 0) and b (device 1); client 1 has session 1 on a, client 2 session 2
    on b; flow control over that registry."""
    registry = make_registry((A, "a", 1), (B, "b", 1))
    open_session(registry, C1, session=1, device=0)
    open_session(registry, C2, session=2, device=1)
    return registry, FlowControl(registry, LIMITS)


def submit(session: int = 1) -> list:
    return frames(Kind.SUBMIT, session, 0, {"ops": []})


def reply(session: int = 1, request: int = 1) -> list:
    return frames(Kind.REPLY, session, request, {"ok": True})


# -- a worker that does not read: pause, resume, lose -----------------------------------------


def test_a_full_worker_queue_pauses_the_frontend_until_it_drains_to_half():
    registry, flow = setup()
    assert flow.on_queue_full(Side.WORKERS, A, submit(), 0.0) == []
    assert registry.counters["workers_send_queue_full"] == 1
    for _ in range(3):
        assert flow.park(Side.WORKERS, A, submit(), 0.1) == []
    assert flow.blocking == {WORKER_A}
    assert registry.counters["frontend_pauses"] == 1
    assert registry.counters["messages_parked"] == 4
    assert flow.figures()["frontend_paused"] is True
    assert flow.figures()["parked_messages"] == 4
    peers = FakePeers()
    peers.room[WORKER_A] = 1  # takes one: still over half
    assert flow.retry(0.2, peers) == []
    assert flow.blocking == {WORKER_A}
    peers.room[WORKER_A] = 1  # half: the frontend is read again
    assert flow.retry(0.3, peers) == []
    assert flow.blocking == set() and flow.outbox.queued(WORKER_A) == 2
    assert len(peers.taken[WORKER_A]) == 2 and registry.counters["frontend_pauses"] == 1


def test_a_worker_full_past_the_timeout_is_lost_and_its_clients_told():
    registry, flow = setup()
    for _ in range(4):
        flow.park(Side.WORKERS, A, submit(), 1.0)
    peers = FakePeers()
    peers.room[WORKER_A] = 0
    assert flow.retry(1.5, peers) == []  # full for exactly the timeout: not yet
    sends = flow.retry(1.51, peers)
    assert A not in registry.workers and 1 not in registry.sessions
    assert registry.counters["slow_workers_lost"] == 1
    assert flow.blocking == set() and WORKER_A not in flow.outbox
    [notice] = sends
    assert (notice.side, notice.identity) == CLIENT_1
    error = error_from_wire(decoded(notice).body)
    assert type(error) is SessionLost and "took none of the messages" in error.message
    assert 2 in registry.sessions  # the other worker's session goes on


# -- a client that does not read: cut, last words, drops --------------------------------------


def fill_client(registry, flow, now: float = 0.0) -> list[Send]:
    """Park replies for client 1 until its queue is full; what the cut returned."""
    sends: list[Send] = []
    for request in range(4):
        sends += flow.park(Side.FRONTEND, C1, reply(request=request), now)
    return sends


def test_a_client_whose_queue_fills_is_cut_and_keeps_only_its_notices():
    registry, flow = setup()
    sends = fill_client(registry, flow)
    assert [(s.side, s.identity, decoded(s).kind) for s in sends] == [
        (Side.WORKERS, A, Kind.CLOSE)]  # closed on its worker, freeing its memory
    assert 1 not in registry.sessions and registry.counters["clients_cut"] == 1
    [last_words] = flow.outbox.parked(CLIENT_1)
    lost = error_from_wire(decoded(Send(Side.FRONTEND, C1, last_words)).body)
    assert type(lost) is SessionLost and lost.details["reason"] == "client_not_reading"
    # Until it reads them, nothing else is parked for it.
    assert flow.park(Side.FRONTEND, C1, reply(), 0.1) == []
    assert registry.counters["dropped_for_cut_clients"] == 1
    assert flow.outbox.queued(CLIENT_1) == 1
    assert flow.blocking == set()  # a client never pauses the frontend


def test_a_cut_client_that_reads_its_last_words_is_parked_for_again():
    registry, flow = setup()
    fill_client(registry, flow)
    peers = FakePeers()
    peers.room[CLIENT_1] = 10
    flow.retry(0.1, peers)
    assert CLIENT_1 not in flow.outbox and len(peers.taken[CLIENT_1]) == 1
    flow.park(Side.FRONTEND, C1, reply(), 0.2)
    assert flow.outbox.queued(CLIENT_1) == 1
    assert registry.counters["dropped_for_cut_clients"] == 0


def test_notices_already_parked_are_kept_through_a_cut():
    registry, flow = setup()
    open_session(registry, C1, session=3, device=1)
    notice = frames(Kind.ERROR, 3, 0, {"code": "session_lost", "message": "m", "details": {}})
    flow.park(Side.FRONTEND, C1, notice, 0.0)
    fill_client(registry, flow)
    kinds = [decoded(Send(Side.FRONTEND, C1, f)).kind for f in flow.outbox.parked(CLIENT_1)]
    assert kinds == [Kind.ERROR] * 3  # the one parked, then one per session it had


# -- peers that are not there -------------------------------------------------------------


def test_a_parked_peer_unreachable_past_a_heartbeat_is_gone():
    registry, flow = setup()
    flow.park(Side.FRONTEND, C1, reply(), 0.0)
    peers = FakePeers()  # client 1 is not there
    assert flow.retry(0.5, peers) == []
    assert flow.retry(1.5, peers) == []  # unreachable for exactly a heartbeat: not yet
    assert 1 in registry.sessions and flow.outbox.queued(CLIENT_1) == 1
    sends = flow.retry(1.51, peers)
    assert CLIENT_1 not in flow.outbox and 1 not in registry.sessions
    assert [(s.identity, decoded(s).kind) for s in sends] == [(A, Kind.CLOSE)]


def test_a_peer_that_reads_between_unreachable_spells_is_not_gone():
    registry, flow = setup()
    flow.park(Side.FRONTEND, C1, reply(), 0.0)
    flow.park(Side.FRONTEND, C1, reply(), 0.0)
    peers = FakePeers()
    flow.retry(0.5, peers)  # unreachable from 0.5
    peers.room[CLIENT_1] = 1
    flow.retry(1.0, peers)  # took one: the spell ends
    del peers.room[CLIENT_1]
    assert flow.retry(2.0, peers) == []  # unreachable again, from 2.0
    assert 1 in registry.sessions and flow.outbox.queued(CLIENT_1) == 1


# -- any order of events ------------------------------------------------------------------

PEERS = [WORKER_A, (Side.WORKERS, B), CLIENT_1, (Side.FRONTEND, C2)]


class FlowMachine(RuleBasedStateMachine):
    """Messages parked for peers that take some, none, or are gone, as the clock moves."""

    def __init__(self) -> None:
        super().__init__()
        self.registry, self.flow = setup()
        self.peers = FakePeers()
        self.peers.room.update(dict.fromkeys(PEERS, 0))  # there, taking nothing yet
        self.now = 0.0
        self.lost_workers: set[bytes] = set()

    @rule(peer=st.sampled_from(PEERS), full=st.booleans())
    def send(self, peer, full):
        side, identity = peer
        if identity in self.lost_workers:
            return  # the registry routes nothing to a worker it lost
        if side is Side.WORKERS and self.flow.blocking:
            return  # the loop reads no client while a worker blocks: nothing to send on
        message = submit() if side is Side.WORKERS else reply()
        if full:
            self.flow.on_queue_full(side, identity, message, self.now)
        elif peer in self.flow.outbox:
            self.flow.park(side, identity, message, self.now)

    @rule(peer=st.sampled_from(PEERS), room=st.integers(0, 5))
    def peer_reads(self, peer, room):
        self.peers.room[peer] = room

    @rule(peer=st.sampled_from(PEERS[2:]))
    def client_goes(self, peer):
        self.peers.room.pop(peer, None)  # (a worker that goes: test_registry, test_limits)

    @rule(step=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.2]))
    def retry(self, step):
        self.now += step
        # A blocking worker is lost when what it takes now leaves it over half full, and it
        # has been full longer than the timeout; otherwise the frontend is read again or not.
        outbox, expected_lost = self.flow.outbox, set()
        for key in self.flow.blocking:
            left = outbox.queued(key) - min(self.peers.room[key], outbox.queued(key))
            if (left > LIMITS.peer_queue // 2
                    and self.now - outbox.full_since[key] > LIMITS.slow_worker_timeout):
                expected_lost.add(key[1])
        lost_before = self.registry.counters["slow_workers_lost"]
        self.flow.retry(self.now, self.peers)
        assert self.registry.counters["slow_workers_lost"] - lost_before == len(expected_lost)
        assert not expected_lost & set(self.registry.workers)
        self.lost_workers |= expected_lost

    @invariant()
    def the_rules_hold(self):
        flow, outbox = self.flow, self.flow.outbox
        assert all(key[0] is Side.WORKERS and outbox.is_full(key) for key in flow.blocking)
        assert flow.figures() == {
            "parked_messages": sum(outbox.queued(k) for k in outbox.keys()),
            "parked_bytes": outbox.bytes, "peers_waiting": len(outbox.keys()),
            "frontend_paused": bool(flow.blocking)}
        for key in outbox.keys():  # bounded (a cut client's last words are fewer)
            assert outbox.queued(key) <= LIMITS.peer_queue
        for identity in self.lost_workers:
            assert (Side.WORKERS, identity) not in outbox


TestFlowMachine = FlowMachine.TestCase
TestFlowMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
