"""Sending and receiving a message's frames on the hot path.

pyzmq's ``send_multipart`` first checks the type of every frame, and ``recv_multipart`` asks
the socket (``RCVMORE``) after every frame; on a small message these cost as much as the
message itself. Fabric's frames are always ``bytes``, ``memoryview`` or ``zmq.Frame``, and
a received frame says itself whether more follow, so these do without both (measured about
20 µs less per message each way on a 2-core machine). Semantics are pyzmq's: buffers of
64 KiB and more travel without a copy, and a multipart message is delivered whole or not at
all (with ``NOBLOCK``, only the first frame can raise ``zmq.Again``).
"""

from __future__ import annotations

import os
import struct
from functools import partial
from typing import Any, Callable, Sequence

import zmq

# Plain ints: an operation on pyzmq's enum flags costs microseconds, several per message.
SNDMORE, NOBLOCK, POLLIN = (int(flag) for flag in (zmq.SNDMORE, zmq.NOBLOCK, zmq.POLLIN))
# The send of pyzmq's low-level API (``zmq.backend``), which ``zmq.Socket.send`` wraps in a
# Python method that only adds DRAFT routing ids and groups: that wrapper costs as much as
# the send itself (0.4 µs per frame warm, more after a wake-up), on every frame.
_send = zmq.backend.Socket.send


def new_routing_id() -> bytes:
    """A fresh random routing id for a socket that connects to the broker: unguessable (a
    peer cannot claim it to reach sessions bound to it), and never starting with the zero
    byte libzmq reserves for the ids it numbers itself."""
    return b"F" + os.urandom(15)


def message_check(sock: zmq.Socket) -> Callable[[], list[Any]]:
    """A call that says, without waiting, whether a message waits on ``sock`` (a non-empty
    list if so).

    It is a zero-timeout ``zmq_poll``: ``getsockopt(EVENTS)`` makes a pyzmq option enum on
    every call, which costs half as much again, and catching the ``zmq.Again`` of a
    non-blocking recv four times as much.
    """
    return partial(zmq.zmq_poll, [(sock, POLLIN)], 0)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """Send ``frames`` as one message (``flags`` as for ``send``, e.g. ``NOBLOCK``)."""
    more = flags | SNDMORE
    for frame in frames[:-1]:
        _send(sock, frame, more, False)  # (data, flags, copy)
    _send(sock, frames[-1], flags, False)


def try_send(sock: zmq.Socket, frames: Sequence[Any]) -> bool:
    """Send ``frames`` without waiting; False, with nothing sent, when the queue is full."""
    try:
        send_frames(sock, frames, NOBLOCK)
    except zmq.Again:
        return False
    return True


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """Receive one message as a list of ``zmq.Frame`` (not copied)."""
    recv = sock.recv
    frame = recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = recv(copy=False)
        frames.append(frame)
    return frames


_MONITOR_EVENT = struct.Struct("=HI")  # libzmq's monitor frame: event id, then its value


def recv_monitor_event(monitor: zmq.Socket) -> dict[str, Any]:
    """One event from a socket monitor (``get_monitor_socket``): ``event``, ``value`` and
    ``endpoint``, as pyzmq's ``recv_monitor_message`` gives them. Decoded here because pyzmq's
    module loads asyncio, which a worker or a broker would pay for at every start."""
    head, endpoint = monitor.recv_multipart()
    event, value = _MONITOR_EVENT.unpack_from(head)
    return {"event": event, "value": value, "endpoint": endpoint}
