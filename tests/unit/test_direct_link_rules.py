"""The direct links' rules, sans I/O (``workers.direct_links``, ``broker.link_grants``): tickets
admit one handshake and one TRANSFER, for their session, in time; senders fall back when no link
comes.
"""

from __future__ import annotations

import logging
import secrets

import pytest
import zmq

from fabric.broker.link_grants import reported_bulk
from fabric.core.protocol import Header, Kind, Message
from fabric.core.security import LINK_USER, link_keys
from fabric.workers import direct_links
from fabric.workers.direct_links import Admissions, Dial, Fallback, Outgoing, credential

pytestmark = pytest.mark.timeout(10)

SESSION = 7


def header(kind: Kind = Kind.TRANSFER, session: int = SESSION) -> Header:
    return Header(kind, session, 3)


def plain(ticket: bytes) -> tuple[bytes, list[bytes]]:
    return b"PLAIN", [LINK_USER, ticket]


@pytest.fixture
def admissions() -> Admissions:
    return Admissions(curve=False)


def test_a_ticket_admits_one_handshake_and_one_transfer_to_its_session(admissions):
    ticket = secrets.token_bytes(32)
    assert admissions.expect(ticket, SESSION, 0.0) == []
    [answer] = admissions.on_zap("r1", *plain(ticket), 1.0)
    assert answer.request == "r1" and answer.user
    [again] = admissions.on_zap("r2", *plain(ticket), 1.0)  # a reused ticket
    assert again.user is None
    assert admissions.take(answer.user, header())
    assert not admissions.take(answer.user, header())  # one message per ticket
    assert admissions.refused == 2


@pytest.mark.parametrize("wrong", [
    lambda t: plain(secrets.token_bytes(32)),  # another ticket
    lambda t: (b"PLAIN", [b"client", t]),  # another user name
    lambda t: (b"NULL", []),
    lambda t: (b"CURVE", [credential(t, curve=True)]),  # the mechanism the receiver does not use
])
def test_a_handshake_without_the_ticket_is_refused(admissions, wrong):
    ticket = secrets.token_bytes(32)
    admissions.expect(ticket, SESSION, 0.0)
    answers = admissions.on_zap("r", *wrong(ticket), 0.0) + admissions.tick(
        direct_links.WAIT_SECONDS + 1)  # (an unknown ticket waits for its grant, then is refused)
    assert [a.user for a in answers] == [None] and admissions.refused == 1


def test_an_admitted_peer_may_carry_only_a_transfer_to_the_ticket_session(admissions):
    for wrong in (header(session=SESSION + 1), header(Kind.SUBMIT), None):
        ticket = secrets.token_bytes(32)
        admissions.expect(ticket, SESSION, 0.0)
        [answer] = admissions.on_zap("r", *plain(ticket), 0.0)
        assert not admissions.take(answer.user, wrong)
    assert not admissions.take(None, header()) and not admissions.take(b"link-99", header())
    assert admissions.refused == 5


def test_only_a_link_granted_to_the_sessions_client_may_carry_a_request(admissions):
    for client, taken in ((False, False), (True, True)):
        ticket = secrets.token_bytes(32)
        admissions.expect(ticket, SESSION, 0.0, client=client)
        [answer] = admissions.on_zap("r", *plain(ticket), 0.0)
        assert admissions.take(answer.user, header(Kind.REQUEST)) is taken


def test_a_handshake_before_its_ticket_waits_for_it_but_not_forever(admissions):
    early, never = secrets.token_bytes(32), secrets.token_bytes(32)
    assert admissions.on_zap("early", *plain(early), 0.0) == []
    assert admissions.on_zap("never", *plain(never), 0.0) == []
    [answer] = admissions.expect(early, SESSION, 0.5)
    assert answer.request == "early" and answer.user
    assert admissions.tick(0.5) == []
    assert (admissions.tick(direct_links.WAIT_SECONDS + 0.1)
            == [direct_links.ZapAnswer("never", None)])


def test_waiting_handshakes_are_bounded(admissions):
    for n in range(direct_links.MAX_WAITING):
        assert admissions.on_zap(n, *plain(secrets.token_bytes(32)), 0.0) == []
    [refused] = admissions.on_zap("over", *plain(secrets.token_bytes(32)), 0.0)
    assert refused.user is None


def test_a_ticket_expires_and_tickets_are_bounded(admissions):
    late = secrets.token_bytes(32)
    admissions.expect(late, SESSION, 0.0)
    [answer] = admissions.on_zap("r", *plain(late), direct_links.TICKET_SECONDS + 1)
    assert answer.user is None
    first = secrets.token_bytes(32)
    admissions.expect(first, SESSION, 100.0)
    for _ in range(direct_links.MAX_TICKETS):
        admissions.expect(secrets.token_bytes(32), SESSION, 100.0)
    assert admissions.on_zap("r", *plain(first), 101.0) == []  # forgotten: waits, unknown


def test_with_curve_the_ticket_is_the_senders_secret_key():
    admissions = Admissions(curve=True)
    ticket = secrets.token_bytes(32)
    admissions.expect(ticket, SESSION, 0.0)
    public, secret = link_keys(ticket)
    assert len(public) == len(secret) == 40 and credential(ticket, True) != ticket
    [answer] = admissions.on_zap("r", b"CURVE", [credential(ticket, True)], 0.0)
    assert answer.user and admissions.take(answer.user, header())


def transfer_frames() -> list[bytes]:
    return [b"header", b"body", b"x" * 10]


def test_a_sender_asks_dials_and_sends_once():
    outgoing = Outgoing()
    frames = transfer_frames()
    ask = outgoing.start(frames, header(), 10, 0.0)
    assert ask.kind == Kind.LINK and ask.session == SESSION
    assert ask.body == {"source": 3, "nbytes": 10}
    ticket = secrets.token_bytes(32)
    dial = outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request,
                                     {"address": "tcp://10.0.0.2:4000", "ticket": ticket}))
    assert dial == Dial(ask.request, "tcp://10.0.0.2:4000", None, ticket)
    assert outgoing.connected(ask.request, 1.0) is frames
    assert outgoing.connected(ask.request, 1.0) is None and outgoing.tick(100.0) == []
    assert outgoing.acknowledged(ask.request) and not outgoing.acknowledged(ask.request)


def test_a_sent_transfer_unacknowledged_too_long_closes_its_link(caplog):
    outgoing = Outgoing()
    ask = outgoing.start(transfer_frames(), header(), 10, 0.0)
    outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request,
                              {"address": "tcp://10.0.0.2:4000", "ticket": bytes(32)}))
    outgoing.connected(ask.request, 1.0)
    assert outgoing.unacknowledged(1.0 + direct_links.ACK_SECONDS / 2) == []
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        assert outgoing.unacknowledged(2.0 + direct_links.ACK_SECONDS) == [ask.request]
    assert "not acknowledged" in caplog.text and not outgoing.acknowledged(ask.request)


@pytest.mark.parametrize("body", [{}, {"address": "tcp://x:1", "ticket": b"short"},
                                  {"address": 5, "ticket": bytes(32)}])
def test_a_refused_or_malformed_grant_sends_through_the_broker(body):
    outgoing = Outgoing()
    frames = transfer_frames()
    ask = outgoing.start(frames, header(), 10, 0.0)
    assert outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request, body)) == \
        Fallback(ask.request, frames)
    assert outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request, body)) is None


def test_no_connection_in_time_falls_back_and_is_logged_once_per_address(caplog):
    outgoing = Outgoing()
    grant = {"address": "tcp://10.0.0.2:4000", "ticket": bytes(32)}
    with caplog.at_level(logging.WARNING, "fabric.worker"):
        for n in range(2):
            ask = outgoing.start(transfer_frames(), header(), 10, 10.0 * n)
            outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request, grant))
            assert outgoing.tick(10.0 * n + direct_links.CONNECT_SECONDS / 2) == []
            [fallback] = outgoing.tick(10.0 * n + direct_links.CONNECT_SECONDS + 0.1)
            assert fallback.link == ask.request and outgoing.connected(ask.request, 99.0) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"no direct link to tcp://10.0.0.2:4000 within {direct_links.CONNECT_SECONDS:g} s: large "
        "tensors moved there travel through the broker"]


@pytest.mark.parametrize("bulk, expected", [
    ({"address": "tcp://10.0.0.2:4000"}, {"address": "tcp://10.0.0.2:4000"}),
    ({"address": "tcp://h:1", "public_key": b"k" * 40}, {"address": "tcp://h:1",
                                                          "public_key": b"k" * 40}),
    ({"address": "ipc:///tmp/x"}, None), ({"address": "tcp://h:1", "public_key": b"k"}, None),
    ("tcp://h:1", None), (None, None)])
def test_the_broker_takes_only_a_well_formed_bulk_endpoint(bulk, expected):
    assert reported_bulk({"bulk": bulk}) == expected


@pytest.mark.parametrize("event, counted", [
    (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, True),  # NULL, or another mechanism
    (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, True),  # closed mid-handshake
    (zmq.EVENT_HANDSHAKE_FAILED_AUTH, False),  # ZAP's refusal: counted by on_zap already
    (zmq.EVENT_DISCONNECTED, False),
])
def test_handshakes_libzmq_refuses_by_itself_are_counted_once(admissions, event, counted):
    assert admissions.refuses(event) is counted
    assert admissions.refused == int(counted)


def test_a_link_that_breaks_before_the_receivers_word_falls_back_once_logged(caplog):
    outgoing = Outgoing()
    frames = ["header", "bytes"]
    for _ in range(2):
        ask = outgoing.start(frames, header(), 10, 0.0)
        outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, ask.request, {
            "address": "tcp://10.0.0.2:5", "ticket": secrets.token_bytes(32)}))
        assert outgoing.broke(ask.request) is None  # (not sent yet: tick's deadline rules)
        assert outgoing.connected(ask.request, 1.0) == frames
        with caplog.at_level(logging.WARNING, "fabric.worker"):
            assert outgoing.broke(ask.request) == Fallback(ask.request, frames)
        assert outgoing.broke(ask.request) is None  # once
    assert [r.getMessage() for r in caplog.records] == [
        "the direct link to tcp://10.0.0.2:5 broke before the receiver took its tensor: sent "
        "again through the broker (so are the next that break there)"]
    taken = outgoing.start(frames, header(), 10, 2.0)
    outgoing.on_grant(Message(Kind.LINK_GRANT, SESSION, taken.request, {
        "address": "tcp://10.0.0.2:5", "ticket": secrets.token_bytes(32)}))
    outgoing.connected(taken.request, 2.0)
    assert outgoing.acknowledged(taken.request) and outgoing.broke(taken.request) is None
