"""The client's pending-request table, fed messages by hand."""

from __future__ import annotations

from fabric.core import protocol
from fabric.core.errors import RemoteError, SessionLost
from fabric.core.protocol import Kind, Message
from fabric.core.session_life import LOST
from fabric.transport.pending import PendingTable


def reply(request: int, session: int = 1, body: dict | None = None) -> Message:
    return Message(Kind.REPLY, session, request, body or {"for": request})


def session_error(session: int, error, request: int = 0) -> Message:
    return protocol.error_message(error, session=session, request=request)


def carrying(*sessions: int) -> PendingTable:
    """A table whose connection carries ``sessions`` (opened, so their lives are OPEN)."""
    table = PendingTable()
    for session in sessions:
        table.life.new_session(session)
    return table


def lost(table: PendingTable) -> dict:
    """The sessions of the table's connection that are lost, with their errors."""
    return {session: life.error for session, life in table.life.sessions.items()
            if life.phase is LOST}


def test_request_ids_are_fresh_and_never_zero():
    table = PendingTable()
    ids = [table.new_request() for _ in range(5)]
    assert len(set(ids)) == 5
    assert 0 not in ids  # 0 means "no request" in the header


def test_replies_are_matched_out_of_order_by_request_id():
    table = PendingTable()
    first, second, third = (table.new_request() for _ in range(3))
    table.on_message(reply(third))
    table.on_message(reply(first))
    assert table.take(second) is None
    assert table.take(first).body == {"for": first}
    table.on_message(reply(second))
    assert table.take(third).body == {"for": third}
    assert table.take(second).body == {"for": second}


def test_a_reply_is_taken_once():
    table = PendingTable()
    request = table.new_request()
    message = reply(request)
    table.on_message(message)
    assert table.take(request) is message
    assert table.take(request) is None


def test_a_duplicate_reply_is_not_filed_twice():
    table = PendingTable()
    request = table.new_request()
    table.on_message(reply(request, body={"n": 1}))
    table.on_message(reply(request, body={"n": 2}))
    assert table.take(request).body == {"n": 1}
    assert table.take(request) is None


def test_session_lost_error_is_recorded_against_the_session():
    table = carrying(7, 8)
    table.on_message(session_error(7, SessionLost("Worker w is gone.", worker="w", session=7)))
    assert set(lost(table)) == {7}
    error = lost(table)[7]
    assert isinstance(error, SessionLost)
    assert error.message == "Worker w is gone."
    assert error.details == {"worker": "w", "session": 7}


def test_other_errors_and_session_zero_do_not_mark_a_session_lost():
    table = carrying(7)
    table.on_message(session_error(7, RemoteError("An op failed.")))
    table.on_message(session_error(0, SessionLost("No session.")))
    table.on_message(Message(Kind.PING, 7))
    assert lost(table) == {}
    assert table.life.error is None  # (session 0 is the connection's own: not lost either)


def test_an_error_answering_a_waiting_request_is_its_reply():
    table = PendingTable()
    request = table.new_request()
    message = session_error(3, RemoteError("Bad op."), request=request)
    table.on_message(message)
    assert table.take(request) is message


def test_late_reply_to_a_forgotten_request_is_dropped():
    table = carrying(1)
    kept, forgotten = table.new_request(), table.new_request()
    table.forget(forgotten)
    table.on_message(reply(forgotten))
    table.on_message(reply(kept))
    assert table.take(forgotten) is None
    assert table.take(kept) is not None
    assert lost(table) == {}


def test_forget_drops_a_reply_that_already_arrived():
    table = PendingTable()
    request = table.new_request()
    table.on_message(reply(request))
    table.forget(request)
    assert table.take(request) is None


def test_reply_to_a_request_never_made_is_dropped():
    table = PendingTable()
    table.on_message(reply(99))
    assert table.take(99) is None


def test_credit_counts_the_runs_of_each_session_and_never_goes_back():
    table = PendingTable()
    request = table.new_request()
    table.on_message(Message(Kind.CREDIT, 1, 0, {"done": 32}))
    table.on_message(Message(Kind.CREDIT, 2, 0, {"done": 16}))
    table.on_message(Message(Kind.CREDIT, 1, 0, {"done": 16}))  # late: says less
    assert table.done == {1: 32, 2: 16}
    assert table.take(request) is None  # a credit answers no request
