"""The hot-path socket helpers (fabric.core.sockets) on a real inproc pair of sockets."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from polling import wait_for

from fabric.core.sockets import message_check, recv_frames, send_frames, try_send


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    sender.setsockopt(zmq.SNDHWM, 2)
    receiver.setsockopt(zmq.RCVHWM, 2)
    receiver.bind("inproc://fabric-sockets-test")
    sender.connect("inproc://fabric-sockets-test")
    try:
        yield sender, receiver
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


@pytest.mark.parametrize("frames", [[b"alone"], [b"header", b"body"],
                                    [b"h", b"", memoryview(b"view"), b"x" * 100_000]])
def test_a_message_arrives_whole_with_its_frames_in_order(pair, frames):
    sender, receiver = pair
    send_frames(sender, frames)
    assert [bytes(frame.buffer) for frame in recv_frames(receiver)] == [bytes(f) for f in frames]


def test_a_large_array_frame_arrives_with_its_bytes(pair):
    sender, receiver = pair
    array = np.arange(100_000, dtype=np.float64)  # above pyzmq's zero-copy threshold
    send_frames(sender, [b"header", array])
    header, received = recv_frames(receiver)
    assert np.array_equal(np.frombuffer(received.buffer, np.float64), array)


def test_message_check_says_whether_a_message_waits_without_taking_it(pair):
    sender, receiver = pair
    waits = message_check(receiver)
    assert not waits()
    send_frames(sender, [b"one", b"two"])
    # (inproc delivers at once; the bound is for safety)
    wait_for(waits, 5, "the message to wait on the socket", interval=0.001)
    assert waits() and waits()  # looking does not read it
    assert len(recv_frames(receiver)) == 2
    assert not waits()


def test_try_send_says_false_and_sends_nothing_when_the_queue_is_full(pair):
    sender, receiver = pair
    sent = 0
    while try_send(sender, [b"header", b"body"]):
        sent += 1
        assert sent < 100, "the bounded queue never filled"
    received = 0
    while message_check(receiver)():
        assert len(recv_frames(receiver)) == 2  # only whole messages were queued
        received += 1
    assert received == sent
