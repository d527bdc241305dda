"""Session life in the broker (``broker.sessions``): the phase table and the session indexes,
driven directly, with a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_registry import A, C1, C2

from fabric.broker.model import Limits, Session, SessionPhase, Worker
from fabric.broker.sessions import PHASE_AFTER, SessionEvent, SessionTable
from fabric.broker.worker_table import WorkerTable

OPENING, OPEN, CLOSING, ENDED = (SessionPhase.OPENING, SessionPhase.OPEN,
                                 SessionPhase.CLOSING, SessionPhase.ENDED)
LIMITS = Limits(open_timeout=5.0)


def table_with_worker():
    """A session table, the worker table it reads, and its worker a (one device)."""
    sessions: dict[int, Session] = {}
    workers = WorkerTable()
    worker = Worker(A, "a", "numpy", [{}], registered=0.0, last_seen=0.0)
    workers.add(worker)
    return SessionTable(sessions, workers, LIMITS), workers, worker


def new_session(table: SessionTable, worker, session_id: int, client: bytes = C1,
                now: float = 0.0) -> Session:
    session = Session(id=session_id, client=client, device=0, local=0, worker=A, lane=A,
                      phase=OPENING, created=now, last_seen=now, hello_request=1)
    table.open(session, worker, now)
    return session


def test_the_table_reads_as_the_life_of_a_session():
    assert PHASE_AFTER[OPENING, SessionEvent.OPENED] is OPEN
    assert PHASE_AFTER[OPEN, SessionEvent.CLOSE] is CLOSING
    assert PHASE_AFTER[CLOSING, SessionEvent.CLOSED] is ENDED
    # The broker may end any live session, and nothing moves an ended one.
    assert all(PHASE_AFTER[phase, SessionEvent.ENDED_BY_BROKER] is ENDED
               for phase in (OPENING, OPEN, CLOSING))
    assert not any(phase is ENDED for phase, _ in PHASE_AFTER)
    # A worker answers only what it was asked: no OPENED while closing, no CLOSED while open.
    assert (CLOSING, SessionEvent.OPENED) not in PHASE_AFTER
    assert (OPEN, SessionEvent.CLOSED) not in PHASE_AFTER
    assert (OPEN, SessionEvent.DEADLINE) not in PHASE_AFTER  # an open session has none


def test_waiting_phases_have_a_deadline_and_an_open_session_has_none():
    table, _, worker = table_with_worker()
    session = new_session(table, worker, 7, now=1.0)
    assert (session.phase, session.deadline) == (OPENING, 6.0)
    assert table.move(session, SessionEvent.OPENED, 2.0) is OPENING  # the phase it was in
    assert (session.phase, session.deadline) == (OPEN, float("inf"))
    table.move(session, SessionEvent.CLOSE, 3.0)
    assert (session.phase, session.deadline) == (CLOSING, 8.0)
    table.move(session, SessionEvent.CLOSE, 4.0)  # asked again: a new deadline
    assert (session.phase, session.deadline) == (CLOSING, 9.0)


def test_an_ended_session_leaves_every_index_and_its_traffic_is_kept():
    table, workers, worker = table_with_worker()
    session = new_session(table, worker, 7)
    new_session(table, worker, 8, client=C2)
    session.messages_in, session.bytes_in = 3, 300
    assert table.end(session) is OPENING
    assert session.phase is ENDED
    assert set(table.sessions) == {8} and worker.sessions == {8}
    assert table.by_client == {C2: {8}}
    assert (table.count_of_client(C1), table.count_on_device(A, 0)) == (0, 1)
    retired = workers.retired[("a", 0)]
    assert (retired.sessions, retired.messages, retired.bytes) == (1, 3, 300)


def test_an_event_a_phase_does_not_take_is_refused_by_the_table():
    table, _, worker = table_with_worker()
    session = new_session(table, worker, 7)
    assert not table.allows(session, SessionEvent.CLOSED)
    with pytest.raises(KeyError):
        table.move(session, SessionEvent.CLOSED, 1.0)
    assert session.phase is OPENING and 7 in table.sessions


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([7, 8, 9]), st.sampled_from(list(SessionEvent))),
                max_size=30))
def test_any_events_keep_the_indexes_in_step(events):
    table, _, worker = table_with_worker()
    live = {n: new_session(table, worker, n, client=C1 if n < 9 else C2) for n in (7, 8, 9)}
    for now, (session_id, event) in enumerate(events):
        session = live.get(session_id)
        if session is None or not table.allows(session, event):
            continue
        table.move(session, event, float(now))
        if session.phase is ENDED:
            del live[session_id]
    assert set(table.sessions) == set(live) == worker.sessions
    assert table.count_on_device(A, 0) == len(live)
    assert {c: s for c, s in table.by_client.items()} == {
        client: ids for client, ids in (
            (C1, {n for n in live if n < 9}), (C2, {n for n in live if n == 9})) if ids}
