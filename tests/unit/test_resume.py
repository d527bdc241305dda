"""Resuming sessions after a takeover, sans I/O (``fabric.core.resume``, ``broker.resume``,
the worker's control machine and executor): what a worker reports, what a broker makes of
it, who may resume, the settling, and what a device never runs twice."""

from __future__ import annotations

import numpy as np
import pytest

from fabric.broker.model import SessionPhase, Side
from fabric.broker.pair import Beat, Pair, State
from fabric.core.errors import HandshakeError, ReplyLost, ResumeRefused
from fabric.core.protocol import Kind, Message
from fabric.core.resume import (RECORD_BYTES, RECORD_REPLIES, HeldSession, ReplyRecord,
                                decode_reports, digest, new_secret, secret_matches)
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.control import Connect, Control, Drop, Send
from fabric.workers.executor import Executor

from test_registry import (CLIENT_TOKEN, LIMITS, decoded, frames, make_registry, only,
                           register_frames, rejected)

pytestmark = pytest.mark.timeout(60)

C1, C2 = b"client-1", b"client-2"
W = b"worker-a"
SECRET = new_secret()
OWNER = digest(CLIENT_TOKEN.encode())


def report(session: int = 0x51, secret: bytes = SECRET, owner: bytes = OWNER,
           submits: int = 7) -> list:
    return HeldSession(session, 0, owner, digest(secret), submits).to_wire()


def registered_with(registry, reports: list, now: float = 1.0) -> None:
    body = register_frames("a", [{"n": 0}])
    message = decoded_body(body)
    message["sessions"] = reports
    registry.from_worker(W, frames(Kind.REGISTER, body=message), now)


def decoded_body(register: list) -> dict:
    from fabric.core import protocol
    return dict(protocol.decode(register).body)


def resume(registry, client: bytes, session: int, secret: bytes, now: float = 1.5,
           token: str = CLIENT_TOKEN) -> list:
    return registry.from_client(client, frames(Kind.RESUME, session, 9,
                                               {"token": token, "secret": secret}), now)


def test_reports_become_resumable_sessions_that_only_their_secret_resumes():
    registry = make_registry()
    registered_with(registry, [report(), report(0x52, owner=digest(b"another token"))])
    session = registry.sessions[0x51]
    assert session.phase is SessionPhase.RESUMABLE and 0x52 not in registry.sessions
    assert registry.counters["resume_reports_refused"] == 1
    # A session id alone, or with a wrong secret, never resumes: refused late, counted.
    for secret in (b"", new_secret()):
        sends = resume(registry, C2, 0x51, secret)
        assert all(send.not_before > 1.5 for send in sends)
        _, error = rejected(sends, C2, ResumeRefused)
        assert error.details["reason"] == "wrong_secret"
    assert registry.counters["resumes_refused"] == 2
    assert session.phase is SessionPhase.RESUMABLE
    # Its own client's secret resumes it, with the batches its device ran.
    resumed = only(resume(registry, C1, 0x51, SECRET), Side.FRONTEND, C1, Kind.RESUMED)
    assert resumed.body["submits"] == 7 and resumed.request == 9
    assert session.phase is SessionPhase.OPEN and session.client == C1
    # Resumed, its data is routed; a second RESUME with another secret is refused, and
    # with its own (its client back over a new connection) moves it there.
    assert registry.from_client(C1, frames(Kind.REQUEST, 0x51, 3, {"op": "sync"}), 1.6)
    rejected(resume(registry, C2, 0x51, new_secret(), now=1.7), C2, ResumeRefused)
    assert session.client == C1
    only(resume(registry, C2, 0x51, SECRET, now=1.8), Side.FRONTEND, C2, Kind.RESUMED)
    assert session.phase is SessionPhase.OPEN and session.client == C2


def test_a_session_no_worker_reported_is_refused_with_the_reason():
    registry = make_registry((W, "a", 1))
    _, error = rejected(resume(registry, C1, 0x77, SECRET), C1, ResumeRefused)
    assert error.details["reason"] == "not_reported" and "--resume-grace" in error.message


def test_an_unclaimed_session_ends_at_its_grace_and_is_closed_on_its_worker():
    registry = make_registry()
    registered_with(registry, [report()])
    sends = registry.tick(1.0 + LIMITS.resume_grace + 0.1)
    assert 0x51 not in registry.sessions
    close = [s for s in sends if s.side is Side.WORKERS and decoded(s).kind == Kind.CLOSE]
    assert decoded(close[0]).session == 0x51
    assert registry.counters["sessions_not_resumed"] == 1


def test_a_broker_that_took_over_settles_until_the_known_tables_workers_report():
    registry = make_registry()
    registry.from_worker(W, register_frames("a", [{"n": 0}]), 0.0)  # the table: worker a
    registry.from_worker(b"worker-b", register_frames("b", [{"n": 0}]), 0.0)
    for identity in (W, b"worker-b"):
        registry.unroutable(Side.WORKERS, identity, 0.1)  # both gone: the table stays
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)
    registry.pair.on_peer(Beat(State.ACTIVE, 1, True), now=0.0)
    hello = frames(Kind.HELLO, 0x11, 1, {"token": CLIENT_TOKEN, "device": 0})
    _, error = rejected(registry.from_client(C1, hello, 2.5), C1, HandshakeError)
    assert error.details["settling"]
    registered_with(registry, [report()], now=2.6)  # a reports; b does not yet
    _, error = rejected(resume(registry, C1, 0x99, SECRET, now=2.7), C1, HandshakeError)
    assert error.details["settling"]  # (b may hold it)
    only(resume(registry, C1, 0x51, SECRET, now=2.7), Side.FRONTEND, C1, Kind.RESUMED)
    # Past the settle time, b is declared lost: clients are served.
    late = 2.5 + LIMITS.settle_time + 0.1
    _, error = rejected(resume(registry, C1, 0x99, SECRET, now=late), C1, ResumeRefused)
    sends = registry.from_client(C1, hello, late)
    assert decoded(sends[0]).kind == Kind.OPEN


def test_the_secret_passes_the_broker_from_opened_to_welcome():
    registry = make_registry((W, "a", 1))
    open_message = decoded(registry.from_client(C1, frames(
        Kind.HELLO, 0x21, 1, {"token": CLIENT_TOKEN, "device": 0}), 0.0)[0])
    assert open_message.body["owner"] == OWNER
    welcome = only(registry.from_worker(W, frames(Kind.OPENED, 0x21, open_message.request,
                                                  {"secret": SECRET}), 0.1),
                   Side.FRONTEND, C1, Kind.WELCOME)
    assert welcome.body["secret"] == SECRET
    assert repr(SECRET) not in repr(registry.sessions[0x21])  # (nothing kept of it)


def test_reports_are_checked_and_bounded():
    good = report()
    assert decode_reports([good, [1, 2], "x", [0, 0, OWNER, OWNER, 1],
                           [5, 3, OWNER, OWNER, 1]], devices=1) == [HeldSession(*good)]
    assert decode_reports({"a": 1}, devices=1) == []
    assert secret_matches(SECRET, digest(SECRET)) and not secret_matches("text", digest(SECRET))


def test_the_reply_record_answers_a_repeated_id_within_its_bounds():
    record = ReplyRecord()
    assert record.keep(1, ["reply-1"], 10, submits=0) == 10
    assert record.get(1) == ["reply-1"] and record.get(2) is None
    assert record.keep(2, ["too large"], RECORD_BYTES + 1, submits=0) == 0
    assert record.get(2) is None
    for request in range(3, 3 + RECORD_REPLIES):
        record.keep(request, [request], 1, submits=0)
    assert len(record) == RECORD_REPLIES and record.get(1) is None
    assert record.nbytes == RECORD_REPLIES


def test_the_reply_record_holds_its_byte_budget_and_notes_what_it_did_not_keep():
    record = ReplyRecord()
    assert record.keep(1, ["half"], RECORD_BYTES // 2, submits=3) == RECORD_BYTES // 2
    assert record.keep(2, ["half"], RECORD_BYTES // 2, submits=3) == RECORD_BYTES // 2
    # Past the session's budget the oldest goes: the change says what the worker holds.
    assert record.keep(3, ["some"], 100, submits=4) == 100 - RECORD_BYTES // 2
    assert record.get(1) is None and record.nbytes == RECORD_BYTES // 2 + 100
    assert record.keep(4, ["no room"], 10, submits=4, room=False) == 0
    assert record.get(4) is None
    # Not kept: sent again with no batch run since, it may run again (same answer) ...
    assert not record.lost(1, submits=3) and not record.lost(4, submits=4)
    # ... with batches run since, it is lost; never answered, it simply runs.
    assert record.lost(1, submits=4) and record.lost(4, submits=5)
    assert not record.lost(99, submits=5)


def executor_with_session() -> tuple[Executor, bytes]:
    executor = Executor(NumpyDevice(0))
    executor.records_replies = True  # (a pair's worker)
    [opened] = executor.handle(Message(Kind.OPEN, 0x31, 1, {"device": 0, "owner": OWNER}))
    return executor, opened.body["secret"]


def test_a_device_never_runs_a_batch_or_a_request_twice():
    executor, secret = executor_with_session()
    session = executor.sessions[0x31]
    assert session.owner == OWNER and secret_matches(secret, session.secret_digest)
    batch = {"ops": [["full", 1, [], {"shape": [2], "dtype": "<f8", "fill_value": 1.0}]]}
    executor.handle(Message(Kind.SUBMIT, 0x31, 0, {**batch, "seq": 1}))
    add = {"ops": [["full", 2, [], {"shape": [2], "dtype": "<f8", "fill_value": 2.0}]],
           "seq": 2, "op": "read", "id": 2}
    [first] = executor.handle(Message(Kind.REQUEST, 0x31, 5, add))
    ran = session.ops
    # Sent again after a resume: the batch is skipped, the request answered from the record.
    credit = executor.handle(Message(Kind.SUBMIT, 0x31, 0, {**batch, "seq": 1}))
    assert [m.kind for m in credit] == [Kind.CREDIT] and credit[0].body["done"] == 2
    [again] = executor.handle(Message(Kind.REQUEST, 0x31, 5, {**add, "again": True}))
    assert again is first and session.ops == ran and session.submits == 2


def test_an_await_sent_again_is_answered_when_its_tensor_arrives_or_at_once():
    """An await answered later records nothing: sent again after a resume, it waits again
    (its first answer may have gone to the broker that died), or is answered at once."""
    executor, _ = executor_with_session()
    executor.handle(Message(Kind.SUBMIT, 0x31, 0, {"ops": [], "seq": 1}))
    ticket = 77
    executor.handle(Message(Kind.REQUEST, 0x31, 3, {"op": "expect", "id": 9, "ticket": ticket}))
    assert executor.handle(Message(Kind.REQUEST, 0x31, 4, {"op": "await", "id": 9})) == []
    again = executor.handle(Message(Kind.REQUEST, 0x31, 4, {"op": "await", "id": 9,
                                                            "again": True}))
    assert again == []  # (waits again)
    arrived = executor.handle(Message(Kind.TRANSFER, 0x31, 0x32, {
        "ticket": ticket, "dtype": "<f8", "shape": [2]}, [np.ones(2).tobytes()]))
    assert [m.request for m in arrived] == [4, 4]  # (the client takes the first)
    [late] = executor.handle(Message(Kind.REQUEST, 0x31, 4, {"op": "await", "id": 9,
                                                             "again": True}))
    assert late.request == 4 and late.body == {"ok": True}


def test_a_read_too_large_to_record_runs_again_until_a_batch_ran_then_is_lost():
    executor, _ = executor_with_session()
    session = executor.sessions[0x31]
    elements = RECORD_BYTES // 8 + 1
    made = {"ops": [["full", 1, [], {"shape": [elements], "dtype": "<f8",
                                     "fill_value": 1.0}]], "seq": 1}
    executor.handle(Message(Kind.SUBMIT, 0x31, 0, made))
    held = executor.allowance.held
    [first] = executor.handle(Message(Kind.REQUEST, 0x31, 5, {"op": "read", "id": 1}))
    assert len(session.replies) == 0 and executor.allowance.held == held  # not kept
    [again] = executor.handle(Message(Kind.REQUEST, 0x31, 5, {"op": "read", "id": 1,
                                                              "again": True}))
    assert "error" not in again.body  # nothing ran since: read again, the same
    assert bytes(again.buffers[0]) == bytes(first.buffers[0])
    # An in-place write ran after the read: its answer is lost, never another value.
    executor.handle(Message(Kind.SUBMIT, 0x31, 0, {"ops": [
        ["add", 1, [1, 1.0], {"out": 1}]], "seq": 2}))
    [lost] = executor.handle(Message(Kind.REQUEST, 0x31, 5, {"op": "read", "id": 1,
                                                             "again": True}))
    assert lost.body["error"]["code"] == ReplyLost.code


def test_the_record_counts_in_the_devices_memory_and_is_given_back_at_close():
    executor, _ = executor_with_session()
    made = {"ops": [["full", 1, [], {"shape": [1000], "dtype": "<f8", "fill_value": 1.0}]]}
    executor.handle(Message(Kind.SUBMIT, 0x31, 0, {**made, "seq": 1}))
    held = executor.allowance.held
    executor.handle(Message(Kind.REQUEST, 0x31, 5, {"op": "read", "id": 1}))
    assert executor.sessions[0x31].replies.nbytes == 8000
    assert executor.allowance.held == held + 8000
    executor.handle(Message(Kind.CLOSE, 0x31, 6))
    assert executor.allowance.held == 0


def control(grace: float = 5.0) -> Control:
    ids = iter(range(1000))
    return Control({"token": "t", "name": "w", "backend": "numpy", "devices": [{}],
                    "max_message_bytes": 1 << 20}, broker="tcp://a:1,tcp://b:1",
                   encrypted=False, heartbeat=0.1, liveness=3, resume_grace=grace,
                   new_identity=lambda: b"id-%d" % next(ids), host_not_resolving=lambda _: None,
                   held=lambda: [HeldSession(*report())])


def registered(machine: Control, now: float) -> None:
    from fabric.core import protocol
    machine.on_beacon_up(now)
    machine.tick(now + 0.25)
    machine.on_message(protocol.encode(Message(Kind.REGISTERED, 0, 0, {
        "server": "s", "heartbeat": 0.1})), now + 0.25)


def test_a_pairs_worker_keeps_its_sessions_for_the_grace_and_reports_them():
    machine = control()
    machine.start(0.0)
    registered(machine, 0.0)
    [connect] = machine.on_disconnected(2.0)
    assert isinstance(connect, Connect) and connect.keep and machine.broker == "tcp://b:1"
    machine.on_beacon_up(2.0)
    [register] = [a for a in machine.tick(2.25) if isinstance(a, Send)]
    assert register.message.body["sessions"] == [report()]
    # No broker takes it within the grace: the sessions are dropped.
    machine.registered = False
    assert any(isinstance(a, Drop) for a in machine.tick(7.5))
    assert machine.holding_since is None


def test_a_single_brokers_worker_keeps_nothing():
    machine = Control({"token": "t", "name": "w", "backend": "numpy", "devices": [{}],
                       "max_message_bytes": 1 << 20}, broker="tcp://a:1", encrypted=False,
                      heartbeat=0.1, liveness=3, resume_grace=5.0,
                      host_not_resolving=lambda _: None)
    machine.start(0.0)
    registered(machine, 0.0)
    [connect] = machine.on_disconnected(2.0)
    assert not connect.keep


def test_the_metrics_count_the_sessions_reported_resumed_and_refused():
    from fabric.broker.metrics import families, figures

    registry = make_registry()
    registered_with(registry, [report(), report(0x52)])
    resume(registry, C2, 0x51, b"wrong")
    resume(registry, C1, 0x51, SECRET)
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)  # (its figures)
    samples = {sample.name: sample.value
               for family in families(figures(registry, 2.0, 0)) for sample in family.samples
               if "resum" in sample.name or "reported" in sample.name}
    assert samples["fabric_pair_sessions_reported_total"] == 2
    assert samples["fabric_pair_sessions_resumed_total"] == 1
    assert samples["fabric_pair_resumes_refused_total"] == 1


def test_without_a_known_table_an_unreported_session_waits_out_the_settle_time():
    registry = make_registry()
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)
    registry.pair.on_peer(Beat(State.ACTIVE, 1, True), now=0.0)
    registered_with(registry, [report()], now=2.5)  # the takeover; no table to wait for
    only(resume(registry, C1, 0x51, SECRET, now=2.6), Side.FRONTEND, C1, Kind.RESUMED)
    hello = frames(Kind.HELLO, 0x11, 1, {"token": CLIENT_TOKEN, "device": 0})
    assert decoded(registry.from_client(C1, hello, 2.6)[0]).kind == Kind.OPEN
    # Another worker may still report 0x99: asked again until the settle time is over.
    _, error = rejected(resume(registry, C1, 0x99, SECRET, now=2.7), C1, HandshakeError)
    assert error.details["settling"]
    late = 2.5 + LIMITS.settle_time + 0.1
    _, error = rejected(resume(registry, C1, 0x99, SECRET, now=late), C1, ResumeRefused)
    assert error.details["reason"] == "not_reported"


def pair_serving_since(registry, now: float) -> None:
    """``registry`` is the backup of a pair, serving since ``now`` (its worker came then)."""
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)
    registry.pair.on_peer(Beat(State.ACTIVE, 1, True), now=0.0)
    registered_with(registry, [], now=now)


def opened_on(registry, client: bytes, now: float) -> None:
    """Session 0x21 of ``client`` opened through ``registry``, its worker's secret SECRET."""
    open_message = decoded(registry.from_client(client, frames(
        Kind.HELLO, 0x21, 1, {"token": CLIENT_TOKEN, "device": 0}), now)[0])
    only(registry.from_worker(W, frames(Kind.OPENED, 0x21, open_message.request,
                                        {"secret": SECRET}), now), Side.FRONTEND, client,
         Kind.WELCOME)


def test_a_pairs_broker_keeps_a_vanished_clients_sessions_for_its_secret():
    """Its link broke, not the broker: the client comes back over a new connection."""
    registry = make_registry()
    pair_serving_since(registry, 2.5)
    opened_on(registry, C1, 2.6)
    session = registry.sessions[0x21]
    assert registry.unroutable(Side.FRONTEND, C1, 3.0) == []  # (not closed on its worker)
    assert session.phase is SessionPhase.RESUMABLE and not session.client
    _, error = rejected(resume(registry, C2, 0x21, new_secret(), now=3.1), C2, ResumeRefused)
    assert error.details["reason"] == "wrong_secret"
    resumed = only(resume(registry, C2, 0x21, SECRET, now=3.2), Side.FRONTEND, C2,
                   Kind.RESUMED)
    assert resumed.request == 9 and session.phase is SessionPhase.OPEN
    assert session.client == C2 and registry._sessions.of_client(C2) == [session]


def test_a_pairs_broker_moves_an_open_session_to_its_clients_new_connection():
    """The client saw its link break before the broker did: it resumes at once."""
    registry = make_registry()
    pair_serving_since(registry, 2.5)
    opened_on(registry, C1, 2.6)
    only(resume(registry, C2, 0x21, SECRET, now=2.7), Side.FRONTEND, C2, Kind.RESUMED)
    assert registry.sessions[0x21].client == C2
    assert registry.unroutable(Side.FRONTEND, C1, 3.0) == []  # (the old one holds nothing)
    assert registry.sessions[0x21].phase is SessionPhase.OPEN


def test_a_lone_brokers_vanished_client_loses_its_sessions_as_before():
    registry = make_registry((W, "a", 1))
    opened_on(registry, C1, 0.1)
    [close] = registry.unroutable(Side.FRONTEND, C1, 0.2)
    assert decoded(close).kind == Kind.CLOSE and 0x21 not in registry.sessions


def test_a_register_reporting_the_most_sessions_stays_within_its_bound():
    from fabric.core.protocol import CONTROL_BODY_BYTES, pack_body
    from fabric.core.resume import MAX_REPORTED

    largest = HeldSession(2**64 - 1, 255, OWNER, OWNER, 2**62).to_wire()
    devices = [{"n": i, "memory": 2**40} for i in range(64)]
    body = pack_body({"token": "t" * 64, "name": "w" * 64, "backend": "numpy",
                      "devices": devices, "sessions": [largest] * MAX_REPORTED})
    assert len(body) < CONTROL_BODY_BYTES[Kind.REGISTER]


def test_a_resume_before_its_workers_lanes_attach_is_told_to_retry_and_then_resumes():
    # A takeover's race (seen in CI): the worker registered, reporting the session, and the
    # client's RESUME came before the worker's lane did; the broker looked up a device that
    # was not online yet, and its KeyError ended the broker.
    registry = make_registry()
    body = decoded_body(register_frames("a", [{"n": 0}]))
    registry.from_worker(W, frames(Kind.REGISTER, body={**body, "sessions": [report()],
                                                        "lanes": [b"lane-a"]}), 1.0)
    session = registry.sessions[0x51]
    _, error = rejected(resume(registry, C1, 0x51, SECRET), C1, HandshakeError)
    assert error.details["settling"] is True and session.phase is SessionPhase.RESUMABLE
    registry.from_worker(b"lane-a", frames(Kind.HEARTBEAT), 1.6)  # (the lane attached)
    only(resume(registry, C1, 0x51, SECRET, now=1.7), Side.FRONTEND, C1, Kind.RESUMED)
    assert session.phase is SessionPhase.OPEN
