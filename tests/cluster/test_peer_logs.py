"""Log lines a peer can cause: each is rate-limited, on every socket, direct links included,
and a bad message never logs a traceback per message (issue 41, section 2, findings 9 and
10). The first tests mount the attack on real processes; the last drives a lane alone."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import zmq

import fabric
from fabric.broker.model import Side
from fabric.core import protocol
from fabric.core.errors import RemoteError, error_from_wire
from fabric.core.protocol import Kind, Message
from fabric.core.security import show_ticket
from fabric.workers.lane import Lane

from conftest import HEARTBEAT
from test_registry import open_session, two_workers

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def linked():
    """A broker and one worker whose direct links listen on loopback."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--bulk-host", "127.0.0.1")) as running:
        yield running


def grant(session: fabric.Session, nbytes: int = 16 << 20) -> tuple[str, bytes]:
    """A direct link to ``session``'s worker, as its client asks for one: address, ticket."""
    answer = session.connection.request(Message(Kind.LINK, session.id, 0, {
        "source": session.id, "nbytes": nbytes}), 5.0, session=session.id)
    assert answer.kind == Kind.LINK_GRANT, answer
    return answer.body["address"], answer.body["ticket"]


def worker_lines(cluster: fabric.LocalCluster) -> list[str]:
    return cluster.log_tail("worker-0", 1_000_000).splitlines()


def test_messages_past_a_direct_links_one_are_not_logged_one_by_one(linked):
    # Finding 9: after the one message its ticket admits, a client's 2,000 more on the same
    # link made 2,000 warnings in the worker's log. Now the first one past it cuts the link
    # (the ticket is spent: the link's reconnections are refused in the handshake), and what
    # is logged of it is rate-limited.
    with linked.connect() as session:
        tensor = session.arange(4.0)
        address, ticket = grant(session)
        before = len(worker_lines(linked))
        link = zmq.Context.instance().socket(zmq.DEALER)
        try:
            link.setsockopt(zmq.LINGER, 0)
            show_ticket(link, ticket, None)
            link.connect(address)
            read = protocol.encode(Message(Kind.REQUEST, session.id, 1, {
                "op": "read", "id": tensor.id}))
            link.send_multipart(read)  # the one message the ticket admits: answered there
            assert link.poll(5000), "the admitted read was not answered on its link"
            assert protocol.decode(link.recv_multipart()).request == 1
            for _ in range(2000):
                try:
                    link.send_multipart(read, zmq.NOBLOCK)
                except zmq.Again:  # (cut: nowhere to send, once its queue filled)
                    break
            time.sleep(1.0)  # (the worker reads what came meanwhile)
        finally:
            link.close(linger=0)
        assert tensor.sum().numpy() == 6.0  # the session goes on
    with linked.connect() as bystander:
        assert bystander.arange(5).sum().numpy() == 10
    lines = worker_lines(linked)[before:]
    assert len(lines) < 10, "\n".join(lines[:20])
    assert any("and cut its connection" in line for line in lines), lines


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


def test_clients_that_vanish_or_stop_reading_are_said_once_an_interval(caplog):
    # A client can open a session and vanish (or stop reading) as often as it likes: the
    # broker's line about it goes through the rate limit too, naming no connection.
    registry = two_workers()
    with caplog.at_level(logging.INFO, logger="fabric.broker"):
        for number in range(400):
            client = b"client-%d" % number
            open_session(registry, client, session=0x5E55_0000 + number, now=1.0)
            registry.unroutable(Side.FRONTEND, client, 2.0)
        for number in range(400, 500):
            client = b"client-%d" % number
            open_session(registry, client, session=0x5E55_0000 + number, now=3.0)
            registry.cut_client(client, 1000, 4.0)
        registry.tick(14.0)
    lines = [r.getMessage() for r in caplog.records if "session(s)" in r.getMessage()]
    assert lines == [
        "1 session(s) dropped: the client disconnected",
        "a client left 1000 messages unread: its 1 session(s) are ended",
        "1 session(s) dropped: the client disconnected: 399 more in the last 12 s",
        "a client left 1000 messages unread: its 1 session(s) are ended: 99 more in the last "
        "10 s"], lines
