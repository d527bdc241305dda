"""Log lines a peer can cause: each is rate-limited, on every socket, direct links included,
and a bad message never logs a traceback per message (issue 41, section 2, findings 9 and
10). The first tests mount the attack on real processes; the last drives a lane alone."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fabric import protocol
from fabric.errors import RemoteError, error_from_wire
from fabric.protocol import Kind, Message
from fabric.workers.lane import Lane

pytestmark = pytest.mark.timeout(120)


class _Broken:
    """An executor whose every message meets a bug."""

    sessions: dict[int, Any] = {}

    def handle(self, message: Message) -> list[Message]:
        raise ValueError("a bug met on a peer's message")


def test_a_bug_met_on_every_message_logs_one_traceback_an_interval(caplog):
    # Finding 10's second half: whatever field meets a bug, the sender cannot have the worker
    # log a traceback per message; the first is logged, the rest counted, then summed up.
    now = [0.0]
    lane = Lane(0, _Broken(), 1 << 16, {}.get, clock=lambda: now[0])  # type: ignore[arg-type]
    frames = protocol.encode(Message(Kind.SUBMIT, 0x51, 7, {"ops": []}))
    with caplog.at_level(logging.INFO, logger="fabric.worker"):
        for _ in range(400):
            [reply] = lane.handle(frames)
            assert (reply.kind, reply.session, reply.request) == (Kind.ERROR, 0x51, 7)
            assert type(error_from_wire(reply.body)) is RemoteError  # each sender is told
        now[0] = 11.0
        lane.flush_log()
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "device 0 failed on a message" in tracebacks[0].message
    assert len(caplog.records) == 2
    assert "399 more in the last 11 s" in caplog.records[1].message
