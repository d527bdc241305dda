"""Sans-I/O tests of tensors moved between sessions (``workers.session_moves``): a TRANSFER
that comes before its ticket, the bounds on what waits for one, and a move whose bytes must
come again, on a device's executor without sockets or processes."""

from __future__ import annotations

import numpy as np
import pytest

from fabric.core.flow import EARLY_TRANSFER_BYTES
from fabric.core.protocol import Kind, Message, decode, encode
from fabric.workers import session_moves
from fabric.workers.lent_memory import LentMemory
from fabric.workers.memory import MemoryBudget
from fabric.workers.session_moves import EARLY_MOST, MAX_EXPECTED

from test_executor import SESSION, opened, read, request

SENDER = 0x5E4D


def transfer(ticket: int, values: np.ndarray | None = None, **body) -> Message:
    """A TRANSFER to the session under ``ticket``, its bytes in its frame (or as ``body``
    says), through the wire's codec."""
    values = np.arange(3.0) if values is None else values
    buffers = () if "lent" in body else (values.tobytes(),)
    return decode(encode(Message(Kind.TRANSFER, SESSION, SENDER, {
        "ticket": ticket, "dtype": values.dtype.str, "shape": list(values.shape), **body},
        buffers)))


def refused(executor) -> int:
    return request(executor, op="stats").body["transfers_refused"]


def test_a_transfer_that_comes_before_its_ticket_waits_for_it_and_is_taken_once():
    executor = opened()
    assert executor.handle(transfer(7)) == []
    assert request(executor, op="expect", id=5, ticket=7).body == {"ok": True}
    assert request(executor, op="await", id=5).body == {"ok": True}
    np.testing.assert_array_equal(read(executor, 5), np.arange(3.0))
    assert refused(executor) == 0
    assert executor.handle(transfer(7, np.ones(3))) == []  # a late copy: dropped at once
    assert refused(executor) == 1
    np.testing.assert_array_equal(read(executor, 5), np.arange(3.0))


def test_a_large_transfer_before_its_ticket_is_dropped_and_its_move_asked_for_again():
    large = np.arange(EARLY_TRANSFER_BYTES // 8 + 1.0)
    executor = opened()
    assert executor.handle(transfer(7, large)) == []
    assert refused(executor) == 1 and not executor.sessions[SESSION].early
    assert request(executor, op="expect", id=5, ticket=7).body == {"ok": True}
    answer = request(executor, op="await", id=5).body
    assert answer["ok"] is True and "could not wait" in answer["again"]
    assert executor.handle(transfer(7, large)) == []  # (its client sends it again)
    assert request(executor, op="await", id=5).body == {"ok": True}
    np.testing.assert_array_equal(read(executor, 5), large)


def test_what_waits_for_a_ticket_is_bounded_in_count_and_time(monkeypatch):
    executor = opened()
    session = executor.sessions[SESSION]
    for ticket in range(EARLY_MOST + 1):
        executor.handle(transfer(ticket))
    assert len(session.early) == EARLY_MOST and refused(executor) == 1  # (kept, and one not)
    for ticket in range(1000, 1000 + MAX_EXPECTED + 1):  # (dropped: their tickets, bounded)
        executor.handle(transfer(ticket))
    assert len(session.early_dropped) == MAX_EXPECTED and 1000 not in session.early_dropped
    assert refused(executor) == 1 + MAX_EXPECTED + 1

    monkeypatch.setattr(session_moves, "EARLY_SECONDS", 0.0)
    waiting = opened()
    waiting.handle(transfer(7))
    assert refused(waiting) == 1  # its time ran out: dropped, its ticket kept
    assert request(waiting, op="expect", id=5, ticket=7).body == {"ok": True}
    assert "again" in request(waiting, op="await", id=5).body


def test_an_await_of_a_tensor_on_its_way_to_nowhere_is_answered_at_once():
    executor = opened()
    assert request(executor, op="expect", id=5, ticket=7).body == {"ok": True}
    answer = request(executor, op="await", id=6).body  # (its expect never came, or failed)
    assert "No tensor 6 is on its way" in answer["error"]["message"]
    executor.handle(transfer(7))
    assert request(executor, op="await", id=5).body == {"ok": True}


@pytest.mark.parametrize("awaited_first", [False, True])
def test_a_lend_that_cannot_be_read_here_is_asked_for_again_with_its_bytes(awaited_first):
    values = np.arange(4.0)
    named = LentMemory(MemoryBudget(None).allowance()).lend(SENDER, 7, values)
    named[0] = "another boot"  # (lent by a worker of another host)
    executor = opened()
    assert request(executor, op="expect", id=5, ticket=7).body == {"ok": True}
    if awaited_first:
        assert executor.handle(Message(Kind.REQUEST, SESSION, 9, {"op": "await", "id": 5})) \
            == []
        [answer] = executor.handle(transfer(7, values, lent=named))
    else:
        assert executor.handle(transfer(7, values, lent=named)) == []
        answer = request(executor, op="await", id=5)
    assert "another host" in answer.body["again"]
    assert 5 not in executor.sessions[SESSION].poisoned
    executor.handle(transfer(7, values))  # (the ticket stays for its bytes)
    assert request(executor, op="await", id=5).body == {"ok": True}
    np.testing.assert_array_equal(read(executor, 5), values)
