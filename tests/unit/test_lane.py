"""Sans-I/O tests of a device's lane (``fabric.workers.lane``): the message-size policy, the
sessions a broker heartbeat no longer lists, transfers that stay on the worker, and failures
that must not end a device, without sockets or threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fabric.core import protocol
from fabric.core.errors import error_from_wire
from fabric.core.protocol import Header, Kind, Message
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor
from fabric.workers.lane import Lane

BROKER_LIMIT = 1 << 16
SESSION, OTHER = 0x51, 0x52


def lane(on_worker: dict[int, int] | None = None) -> Lane:
    """A lane of device 0; ``on_worker`` says which device holds which other session."""
    return Lane(0, Executor(NumpyDevice(0)), BROKER_LIMIT, (on_worker or {}).get)


def run(lane: Lane, message: Message) -> list[Message]:
    return lane.handle(protocol.encode(message))


def open_session(lane: Lane, session: int = SESSION, **body: Any) -> None:
    [opened] = run(lane, Message(Kind.OPEN, session, 1, {"device": 0, **body}))
    assert opened.kind == Kind.OPENED


def put(lane: Lane, tensor: int, count: int, session: int = SESSION) -> None:
    data = np.zeros(count, np.uint8)
    assert [r for r in run(lane, Message(Kind.SUBMIT, session, 0, {"ops": [
        ["put", tensor, [], {"dtype": "|u1", "shape": [count], "buffer": 0}]]}, (data,)))
            if r.kind != Kind.CREDIT] == []


def read(lane: Lane, tensor: int, session: int = SESSION) -> Message:
    [reply] = run(lane, Message(Kind.REQUEST, session, 9, {"op": "read", "id": tensor}))
    return reply


def sent(lane: Lane, reply: Message) -> Message:
    """What the lane sends for ``reply``, as the broker gets it."""
    return protocol.decode(lane.frames(reply))


def test_a_read_bigger_than_its_client_takes_becomes_message_too_large():
    device = lane()
    open_session(device, max_message_bytes=1000)
    put(device, 1, 1000)
    put(device, 2, 1001)
    assert sent(device, read(device, 1)).buffers  # exactly the limit: the bytes themselves
    error = error_from_wire(sent(device, read(device, 2)).body["error"])
    assert type(error).__name__ == "MessageTooLarge"
    assert (error.details["size"], error.details["limit"]) == (1001, 1000)
    assert "read it in slices" in error.message


def test_the_broker_limit_caps_a_client_that_says_more_or_nothing():
    for said in ({"max_message_bytes": 10 * BROKER_LIMIT}, {}, {"max_message_bytes": "big"}):
        device = lane()
        open_session(device, **said)
        put(device, 1, BROKER_LIMIT + 1)
        error = sent(device, read(device, 1)).body["error"]
        assert error["details"]["limit"] == BROKER_LIMIT


def test_attach_takes_the_brokers_limit_and_says_heartbeat():
    device = lane()
    assert device.attach(100).kind == Kind.HEARTBEAT
    open_session(device)
    put(device, 1, 101)
    assert sent(device, read(device, 1)).body["error"]["details"]["limit"] == 100


def test_a_transfer_bigger_than_the_broker_takes_carries_the_error_instead():
    device = lane()
    open_session(device)
    put(device, 1, BROKER_LIMIT + 1)
    [transfer] = [r for r in run(device, Message(Kind.SUBMIT, SESSION, 0, {"ops": [
        ["send", 0, [1], {"session": OTHER, "ticket": 5}]]})) if r.kind == Kind.TRANSFER]
    assert not device.stays_on_worker(transfer)  # (OTHER is on another worker)
    message = sent(device, transfer)
    assert (message.kind, message.session, message.body["ticket"]) == (Kind.TRANSFER, OTHER, 5)
    assert "moved with .to()" in message.body["error"]["message"] and not message.buffers


def test_a_transfer_to_a_session_of_this_worker_stays_on_it():
    device = lane(on_worker={OTHER: 1})
    open_session(device)
    put(device, 1, 8)
    replies = run(device, Message(Kind.SUBMIT, SESSION, 0, {"ops": [
        ["send", 0, [1], {"session": OTHER, "ticket": 5}]]}))
    assert [device.stays_on_worker(r) for r in replies] == [True]
    assert not device.stays_on_worker(read(device, 1))  # a reply goes to the client


def test_a_heartbeat_closes_the_sessions_the_broker_no_longer_lists():
    device = lane()
    open_session(device, SESSION)
    open_session(device, OTHER)
    for body in ({"sessions": "not a list"}, {}):
        frames = protocol.encode(Message(Kind.HEARTBEAT, body=body))
        device.reconcile(protocol.decode_header(frames[0]), frames)
    device.reconcile(Header(Kind.HEARTBEAT), [Header(Kind.HEARTBEAT).pack(), b"\xc1"])
    assert set(device.executor.sessions) == {SESSION, OTHER}  # nothing to go by: kept
    frames = protocol.encode(Message(Kind.HEARTBEAT, body={"sessions": [OTHER]}))
    device.reconcile(protocol.decode_header(frames[0]), frames)
    assert set(device.executor.sessions) == {OTHER}


def test_reset_forgets_every_session():
    device = lane()
    open_session(device)
    device.reset()
    assert device.executor.sessions == {}
    assert read(device, 1).body["error"]["code"] == "session_lost"


def test_a_malformed_message_or_a_bug_is_answered_and_the_device_goes_on(monkeypatch):
    device = lane()
    open_session(device)
    header = Header(Kind.REQUEST, SESSION, 3).pack()
    [malformed] = device.handle([header, b"\xc1 not msgpack"])
    assert (malformed.kind, malformed.request) == (Kind.ERROR, 3)
    assert "not valid msgpack" in malformed.body["message"]

    def broken(message: Message) -> list[Message]:
        raise RuntimeError("a bug")
    monkeypatch.setattr(device.executor, "handle", broken)
    [answer] = run(device, Message(Kind.REQUEST, SESSION, 4, {"op": "sync"}))
    assert (answer.kind, answer.session, answer.request) == (Kind.ERROR, SESSION, 4)
    assert "it goes on serving" in answer.body["message"]
    monkeypatch.undo()
    assert read(device, 99).body["error"]["code"] == "protocol_error"  # still serving


@pytest.mark.parametrize("kind", [Kind.CREDIT, Kind.CLOSED])
def test_replies_without_buffers_are_sent_as_they_are(kind):
    device = lane()
    reply = Message(kind, SESSION, 1, {"done": 1} if kind == Kind.CREDIT else {})
    assert device.frames(reply) == protocol.encode(reply)
