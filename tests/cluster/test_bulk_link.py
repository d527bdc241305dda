"""The direct links' I/O (``workers.direct_links_io``) between two endpoints in this process, each
on its own ZeroMQ context (ZAP handlers are per context), over loopback TCP; the broker's two
grants handed to them by the test. End to end with real workers: ``test_direct_links.py``.
"""

from __future__ import annotations

import logging
import secrets

import numpy as np
import pytest
import zmq
from polling import wait_for

from fabric.core import protocol
from fabric.core.protocol import Kind, Message
from fabric.workers.direct_links import CONNECT_SECONDS
from fabric.workers.direct_links_io import BulkLinks

pytestmark = pytest.mark.timeout(20)

SESSION, SOURCE = 11, 12


class Side:
    """One worker's BulkLinks, its poller, and what reached its devices."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.delivered: list[list[zmq.Frame]] = []
        self.reads: list[tuple[bytes, list[zmq.Frame]]] = []
        self.links = BulkLinks(self.context, "127.0.0.1", None, 1 << 30, self.delivered.append,
                               lambda routing, frames: self.reads.append((routing, frames)))
        self.poller = zmq.Poller()
        self.links.watch(self.poller)
        self.fallbacks: list = []

    def turn(self) -> None:
        for sock, _ in self.poller.poll(10):
            self.links.on_ready(sock)
        self.fallbacks += self.links.tick()

    def close(self) -> None:
        self.links.close()
        self.context.term()


@pytest.fixture
def sides():
    made = Side(), Side()
    yield made
    for side in made:
        side.close()


def transfer(values: np.ndarray) -> list[zmq.Frame]:
    frames = protocol.encode(Message(Kind.TRANSFER, SESSION, SOURCE, {
        "ticket": 5, "dtype": values.dtype.str, "shape": list(values.shape)}, (values,)))
    return [zmq.Frame(f) for f in frames]


def grant(sender: Side, receiver: Side, frames: list[zmq.Frame], ticket: bytes) -> None:
    """What the broker does for a LINK request: both grants."""
    ask = sender.links.send(frames, sum(len(f) for f in frames[1:]))
    receiver.links.from_broker(Message(Kind.LINK_EXPECT, SESSION, 0, {"ticket": ticket}))
    assert sender.links.from_broker(Message(Kind.LINK_GRANT, SESSION, ask.request, {
        "address": receiver.links.address, "ticket": ticket})) == []


def run_until(condition, what: str, *sides: Side,
              seconds: float = 2 * CONNECT_SECONDS + 2) -> None:
    """Turn ``sides`` (each polls its sockets for 10 ms) until ``condition`` holds."""
    def turned() -> bool:
        if condition():
            return True
        for side in sides:
            side.turn()
        return False
    wait_for(turned, seconds, what, interval=0)


def test_a_granted_transfer_arrives_whole_and_its_link_closes(sides):
    sender, receiver = sides
    values = np.arange(1 << 18, dtype=np.float64)
    grant(sender, receiver, transfer(values), secrets.token_bytes(32))
    run_until(lambda: receiver.delivered and not sender.links._dials,
              "the transfer delivered and its link closed", sender, receiver)
    [frames] = receiver.delivered
    message = protocol.decode(frames)
    assert message.session == SESSION and bytes(message.buffers[0]) == values.tobytes()
    assert sender.fallbacks == [] and receiver.links.admissions.refused == 0


def test_a_ticket_the_receiver_never_got_falls_back_and_a_used_one_is_refused(sides):
    sender, receiver = sides
    frames = transfer(np.ones(10))
    ask = sender.links.send(frames, 100)  # granted by a broker the receiver never heard from
    sender.links.from_broker(Message(Kind.LINK_GRANT, SESSION, ask.request, {
        "address": receiver.links.address, "ticket": secrets.token_bytes(32)}))
    run_until(lambda: sender.fallbacks, "the sender to fall back", sender, receiver)
    assert [f.frames for f in sender.fallbacks] == [frames] and not receiver.delivered
    assert receiver.links.admissions.refused >= 1
    ticket = secrets.token_bytes(32)
    grant(sender, receiver, transfer(np.ones(10)), ticket)
    run_until(lambda: receiver.delivered, "the transfer delivered", sender, receiver)
    refused = receiver.links.admissions.refused
    sender.fallbacks.clear()
    again = sender.links.send(transfer(np.ones(10)), 100)  # the same ticket once more
    sender.links.from_broker(Message(Kind.LINK_GRANT, SESSION, again.request, {
        "address": receiver.links.address, "ticket": ticket}))
    run_until(lambda: sender.fallbacks, "the used ticket's fallback", sender, receiver)
    assert len(receiver.delivered) == 1 and receiver.links.admissions.refused > refused


def test_a_new_broker_connection_drops_the_dials_of_the_old(sides):
    sender, receiver = sides
    ask = sender.links.send(transfer(np.ones(10)), 100)
    sender.links.from_broker(Message(Kind.LINK_GRANT, SESSION, ask.request, {
        "address": "tcp://127.0.0.1:9", "ticket": secrets.token_bytes(32)}))
    assert sender.links._dials
    sender.poller = zmq.Poller()
    # What waited is handed back (a pair's takeover sends it through the new broker)
    [waiting] = sender.links.watch(sender.poller)
    assert waiting.link == ask.request
    assert not sender.links._dials and sender.links.tick() == []
    assert sender.links.watch(sender.poller) == []


def _null_peers(address: str, count: int) -> list[zmq.Socket]:
    """``count`` raw DEALERs showing no credentials (the NULL mechanism), connecting to
    ``address``; each retries its handshake every 100 ms until closed."""
    context = zmq.Context.instance()
    peers = []
    for _ in range(count):
        peer = context.socket(zmq.DEALER)
        peer.linger = 0
        peer.connect(address)
        peers.append(peer)
    return peers


@pytest.mark.timeout(40)
def test_a_peer_without_credentials_is_refused_counted_and_a_flood_logged_once(sides, caplog):
    _, receiver = sides
    peers = _null_peers(receiver.links.address, 20)
    try:
        with caplog.at_level(logging.WARNING, "fabric.worker"):
            # (each retries, at libzmq's pace: slow on a busy machine)
            run_until(lambda: receiver.links.admissions.refused >= len(peers),
                      "every peer refused", receiver, seconds=20)
    finally:
        for peer in peers:
            peer.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no credentials" in said[0]  # (the rest: in a summary later)
    assert receiver.delivered == [] and receiver.reads == []
    sender = Side()  # and a granted link still goes through
    try:
        values = np.arange(1000.0)
        grant(sender, receiver, transfer(values), secrets.token_bytes(32))
        run_until(lambda: receiver.delivered, "the transfer delivered", sender, receiver)
    finally:
        sender.close()
    assert bytes(protocol.decode(receiver.delivered[0]).buffers[0]) == values.tobytes()


def test_a_link_whose_receiver_goes_before_its_word_falls_back_through_the_broker():
    sender, receiver = Side(), Side()
    try:
        frames = transfer(np.arange(1 << 20, dtype=np.float64))
        grant(sender, receiver, frames, secrets.token_bytes(32))

        def sent() -> bool:  # (the receiver is not read once it is sent)
            if sender.links.outgoing._sent:
                return True
            sender.turn()
            if not sender.links.outgoing._sent:
                receiver.turn()
            return False
        wait_for(sent, 2 * CONNECT_SECONDS, "the transfer sent", interval=0)
        receiver.close()  # as its process ends: the connection closes, the message unread
        run_until(lambda: sender.fallbacks, "the sender to fall back", sender)
        assert [f.frames for f in sender.fallbacks] == [frames] and not sender.links._dials
        assert receiver.delivered == []
    finally:
        sender.close()
        if not receiver.context.closed:
            receiver.close()
