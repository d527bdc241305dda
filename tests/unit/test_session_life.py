"""A client session's life without sockets: open, lost with its error, closed.

``SessionLife`` and ``ConnectionLife`` are sans I/O, so every transition of
``fabric.core.session_life.PHASE_AFTER`` is driven here by plain calls, and through the op stream
and the pending-request table that read and move them.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.arrays.stream import OpStream
from fabric.core import protocol
from fabric.core.errors import FabricError, SessionClosed, SessionLost
from fabric.core.session_life import (
    CLOSED,
    LOST,
    OPEN,
    ONE_THREAD,
    PHASE_AFTER,
    ConnectionLife,
    Event,
    SessionLife,
)
from fabric.transport.pending import PendingTable

F8 = np.dtype("float64")


def in_another_thread(call):
    """What ``call()`` raised (or None) when run in a thread of its own."""
    raised = []

    def run() -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001  (handed back to the test)
            raised.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return raised[0] if raised else None


# -- one session ---------------------------------------------------------------------------


def test_a_new_session_is_open_without_error_and_usable_by_its_thread():
    life = SessionLife(0x5E55)
    assert life.phase is OPEN and life.error is None
    assert life.thread == threading.get_ident()
    life.check_usable()


def test_open_then_lost_then_closed():
    life = SessionLife(0x5E55)
    error = SessionLost("Worker w is gone.")
    assert life.lose(error) is True
    assert life.phase is LOST and life.error is error
    life.check_usable()  # a lost session still takes ops: its error comes when they are sent
    assert life.close() is LOST  # the phase it was in: the broker has forgotten it already
    assert life.phase is CLOSED and life.error is error  # (why it was lost, kept)


def test_open_then_closed_refuses_every_later_use():
    life = SessionLife(0x5E55)
    assert life.close() is OPEN
    assert life.phase is CLOSED and life.error is None and life.thread is None
    with pytest.raises(SessionClosed, match="0x5e55 is closed: open a new session"):
        life.check_usable()


def test_closed_is_final():
    life = SessionLife()
    life.close()
    assert life.lose(SessionLost("Worker w is gone.")) is False
    assert life.phase is CLOSED and life.error is None
    assert life.close() is CLOSED  # closing twice changes nothing


def test_the_first_loss_error_wins():
    life = SessionLife()
    first = SessionLost("Worker w is gone.")
    later = SessionLost("Session 0x1 is not open on this broker.")
    assert life.lose(first) is True
    assert life.lose(later) is False
    assert life.error is first


def test_another_thread_may_not_use_a_session():
    life = SessionLife()
    error = in_another_thread(life.check_usable)
    assert type(error) is FabricError and str(error) == ONE_THREAD


def test_the_table_leaves_closed_by_no_event_and_loses_only_an_open_life():
    assert {phase for (phase, _), _ in PHASE_AFTER.items()} == {OPEN, LOST}
    assert {after for (_, event), after in PHASE_AFTER.items() if event is Event.LOSS} == {LOST}
    assert all(PHASE_AFTER[phase, Event.CLOSE] is CLOSED for phase in (OPEN, LOST))
    assert (LOST, Event.LOSS) not in PHASE_AFTER  # the first loss named the cause


@given(st.lists(st.one_of(st.integers(0, 3), st.just("close")), max_size=8))
def test_any_order_of_events_ends_as_the_table_says(events):
    """Phase: CLOSED once closed, else LOST once lost; error: the first loss before a close."""
    life = SessionLife()
    errors = [SessionLost(f"loss {n}") for n in range(4)]
    for event in events:
        if event == "close":
            life.close()
        else:
            life.lose(errors[event])
    closing = events.index("close") if "close" in events else len(events)
    losses = [errors[event] for event in events[:closing]]
    expected = CLOSED if closing < len(events) else LOST if losses else OPEN
    assert life.phase is expected
    assert life.error is (losses[0] if losses else None)
    assert (life.thread is None) is (expected is CLOSED)


# -- a connection and its sessions ---------------------------------------------------------


def test_a_lost_connection_makes_all_its_sessions_lost_with_its_error():
    connection = ConnectionLife()
    first, second = connection.new_session(1), connection.new_session(2)
    error = SessionLost("The connection to the broker was lost.")
    assert connection.lose(error) is True
    assert connection.phase is LOST and connection.error is error
    assert (first.phase, first.error) == (LOST, error)
    assert (second.phase, second.error) == (LOST, error)


def test_a_lost_connection_leaves_an_earlier_loss_and_a_closed_session_as_they_were():
    connection = ConnectionLife()
    lost_before, closed, still_open = (connection.new_session(n) for n in (1, 2, 3))
    worker_gone = SessionLost("Worker w is gone.")
    lost_before.lose(worker_gone)
    closed.close()
    connection.lose(SessionLost("The connection to the broker was lost."))
    assert lost_before.error is worker_gone  # the first loss's error wins
    assert closed.phase is CLOSED and closed.error is None  # closed is final
    assert still_open.phase is LOST and still_open.error is connection.error


def test_a_second_connection_loss_changes_nothing():
    connection = ConnectionLife()
    session = connection.new_session(1)
    first = SessionLost("lost")
    connection.lose(first)
    assert connection.lose(SessionLost("lost again")) is False
    assert connection.error is first and session.error is first


def test_a_session_opened_over_a_lost_connection_is_born_lost():
    connection = ConnectionLife()
    error = SessionLost("The connection to the broker was lost.")
    connection.lose(error)
    assert connection.new_session(5).error is error


def test_the_broker_loses_one_session_and_no_other():
    connection = ConnectionLife()
    lost, other = connection.new_session(1), connection.new_session(2)
    error = SessionLost("Worker w is gone.")
    connection.lose_session(1, error)
    assert (lost.phase, lost.error) == (LOST, error)
    assert other.phase is OPEN and connection.phase is OPEN


def test_a_notice_for_a_session_not_carried_is_dropped():
    connection = ConnectionLife()
    connection.new_session(1)
    connection.forget(1)  # closed
    connection.lose_session(1, SessionLost("Session 0x1 is not open on this broker."))
    connection.lose_session(9, SessionLost("Session 0x9 is not open on this broker."))
    assert connection.sessions == {} and connection.phase is OPEN


def test_error_of_a_message_is_its_session_loss_else_its_connection_loss():
    connection = ConnectionLife()
    connection.new_session(1)
    connection.new_session(2)
    assert connection.error_of(1) is None and connection.error_of(0) is None
    worker_gone = SessionLost("Worker w is gone.")
    connection.lose_session(1, worker_gone)
    assert connection.error_of(1) is worker_gone and connection.error_of(2) is None
    dropped = SessionLost("The connection to the broker was lost.")
    connection.lose(dropped)
    assert connection.error_of(1) is worker_gone  # the first loss's error wins
    assert connection.error_of(2) is dropped
    assert connection.error_of(0) is dropped  # the connection's own messages (HELLO, admin)
    assert connection.error_of(77) is dropped  # a session it does not carry (a HELLO's)


def test_a_closing_session_still_hears_of_its_connection_loss():
    """Closed, its CLOSE may still wait for an answer: the connection's loss ends the wait,
    and a notice of the session's loss meanwhile changes nothing."""
    connection = ConnectionLife()
    session = connection.new_session(1)
    session.close()
    connection.forget(1)  # (as fabric.Session closes: before its CLOSE is sent)
    connection.lose_session(1, SessionLost("Session 0x1 is not open on this broker."))
    assert connection.error_of(1) is None
    dropped = SessionLost("The connection to the broker was lost.")
    connection.lose(dropped)
    assert session.error is None and connection.error_of(1) is dropped


def test_a_closed_connection_is_final():
    connection = ConnectionLife()
    assert connection.close() is OPEN
    assert connection.lose(SessionLost("lost")) is False
    assert connection.phase is CLOSED and connection.error is None


# -- the readers: the op stream and the pending-request table ------------------------------


class Owner:
    """A session's stand-in, holding its stream (which never fills a batch here)."""

    def __init__(self, life: SessionLife) -> None:
        self.stream = OpStream(self, life.session_id, life)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing is sent in these tests."""


def add(stream: OpStream):
    return stream.push_op("add", (0, 1.0), {}, 4, (4,), F8, ("here", 0))


def test_the_stream_reads_the_session_life():
    connection = ConnectionLife()
    owner = Owner(connection.new_session(0x5E55))
    connection.lose(SessionLost("The connection to the broker was lost."))
    kept = add(owner.stream)  # lost: still queued, its error is raised when it is sent
    assert owner.stream.batch == [(kept.id, "add", 0, 1.0)]
    assert owner.stream.close() is LOST
    with pytest.raises(SessionClosed, match="0x5e55 is closed"):
        add(owner.stream)
    assert owner.stream.batch == []


def test_a_stream_of_its_own_belongs_to_the_thread_that_made_it():
    owner = Owner(SessionLife(0x5E55))
    error = in_another_thread(lambda: add(owner.stream))
    assert type(error) is FabricError and str(error) == ONE_THREAD
    assert owner.stream.batch == []


def test_a_notice_of_loss_reaches_the_stream_through_the_pending_table():
    table = PendingTable()
    owner = Owner(table.life.new_session(7))
    error = SessionLost("Worker w is gone.", worker="w", session=7)
    table.on_message(protocol.error_message(error, session=7))
    assert owner.stream.life.phase is LOST
    assert owner.stream.life.error.details == {"worker": "w", "session": 7}
    assert table.life.phase is OPEN  # the connection itself goes on
