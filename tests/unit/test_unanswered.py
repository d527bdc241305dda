"""What a client of a broker pair sends again after a takeover (``fabric.transport.unanswered``),
sans I/O: batches past the device's count, awaited requests marked ``again``, nothing else."""

from __future__ import annotations

import pytest

from fabric.core.protocol import Kind, Message
from fabric.transport.unanswered import Unanswered

pytestmark = pytest.mark.timeout(30)


def submit(seq: int) -> Message:
    return Message(Kind.SUBMIT, 7, 0, {"ops": [], "seq": seq})


def request(request_id: int, seq: int | None = None) -> Message:
    body = {"op": "read", "id": 1, **({"ops": [], "seq": seq} if seq else {})}
    return Message(Kind.REQUEST, 7, request_id, body)


def test_batches_past_the_devices_count_and_awaited_requests_go_again_in_order():
    waiting = {11, 12}
    kept = Unanswered(lambda session: 0, waiting.__contains__)
    for message in (submit(1), request(10, seq=2), submit(3), request(11), submit(4),
                    request(12, seq=5), Message(Kind.PING, 7)):
        kept.sent(message)
    again = kept.again(7, submits=3)
    assert [(m.kind, m.request, m.body.get("seq")) for m in again] == [
        (Kind.REQUEST, 11, None), (Kind.SUBMIT, 0, 4), (Kind.REQUEST, 12, 5)]
    assert all(m.body["again"] for m in again if m.kind is Kind.REQUEST)
    assert kept.held(7) == 0  # (sent again, they are kept again as they go)


def test_what_was_answered_is_swept_out_as_a_session_sends_more():
    done = {"n": 0}
    kept = Unanswered(lambda session: done["n"], lambda request: False)
    for seq in range(1, 200):
        done["n"] = seq - 1  # the device keeps up
        kept.sent(submit(seq))
    assert kept.held(7) <= 65
    kept.forget(7)
    assert kept.again(7, submits=0) == []
