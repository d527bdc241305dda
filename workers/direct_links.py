"""Direct links between workers, sans I/O: the tickets a receiver admits, and the large
TRANSFERs a sender sends over a link the broker granted, or through the broker.

Rule 1 (receiver): a peer reaches a worker's bulk endpoint only through the ZeroMQ handshake,
whose ZAP request this module answers: it is admitted with a ticket the broker gave this
worker (``LINK_EXPECT``) for one destination session, once, within ``TICKET_SECONDS``. So
nothing an unadmitted peer sends is ever buffered, and an admitted one carries exactly one
message to that session: a TRANSFER, or, from the session's own client, a REQUEST (a read,
answered on the link). A ZAP request may come before its ticket (the broker tells both
sides at once): it waits, at most ``MAX_WAITING`` of them, until ``WAIT_SECONDS`` have
passed, then is refused. Refusals are counted, and so are the handshakes libzmq refuses
before any ZAP request (a peer showing no credentials, or another mechanism: ``refuses``).

Rule 2 (sender): a TRANSFER of at least ``LINK_THRESHOLD`` bytes for another worker asks
the broker for a link (``LINK``); without a grant and a connection within
``CONNECT_SECONDS`` (a firewall, NAT, an old broker), or with a grant that says no, it goes
through the broker as before, and the first such fallback to each address is logged.

The receiver acknowledges the TRANSFER it took (an empty message back on the link); a sender
closes a link when acknowledged, or ``ACK_SECONDS`` after sending (logged: the receiver
vanished, and the client's wait for the tensor says so). A link that breaks before the
receiver's word (its connection closes, or TCP leaves its bytes unacknowledged for
``fabric.core.security.LINK_STALL_SECONDS``) has its TRANSFER sent once more, through the
broker, and says so once per address: the receiving device takes whichever copy comes
first, since the move's own ticket (``expect``) admits one, so a late copy is dropped there
and nothing is stored twice. A new connection to the broker closes every dial: where a
pair's takeover keeps the sessions, what waited goes through the new broker once the worker
registered there, and once more a liveness window later (the receiving worker may register
after this one); otherwise it is dropped with its sessions.

A ticket is 32 random bytes. Shown in the handshake: without CURVE as the PLAIN password;
with CURVE as the sender's key pair, whose secret key is the ticket itself (so only who
holds the ticket can complete the handshake, and the link is encrypted with the receiver's
own key).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import zmq

from fabric.core.protocol import Header, Kind, Message
from fabric.core.security import LINK_USER, link_keys

log = logging.getLogger("fabric.worker")

LINK_THRESHOLD = 1 << 20  # bytes of array a TRANSFER carries before it asks for a link
CONNECT_SECONDS = 2.0  # a sender's wait for a grant and a connection, then the broker
ACK_SECONDS = 60.0  # a sent TRANSFER's wait for the receiver's word, then its link closes
TICKET_SECONDS = 10.0  # a ticket not used within this is forgotten
WAIT_SECONDS = 1.0  # a handshake whose ticket is not known yet waits this long for it
MAX_TICKETS = 256  # tickets a receiver holds at once (beyond: the oldest is forgotten)
MAX_WAITING = 16  # handshakes waiting for their ticket at once (beyond: refused)
_WORKER_KINDS = frozenset({Kind.TRANSFER})  # what a link granted to a worker may carry
_CLIENT_KINDS = frozenset({Kind.TRANSFER, Kind.REQUEST})  # and one granted to a client
# Handshakes libzmq fails before asking ZAP (the NULL mechanism, a mismatched one, a peer that
# closes mid-handshake); ZAP's own refusals come as EVENT_HANDSHAKE_FAILED_AUTH, counted
# where they are answered (``Admissions.on_zap``), so that event is not one of these.
HANDSHAKE_REFUSALS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def credential(ticket: bytes, curve: bool) -> bytes:
    """What ZAP sees of ``ticket``'s holder: with CURVE its public key (32 bytes), else the
    PLAIN password (the ticket)."""
    return zmq.utils.z85.decode(link_keys(ticket)[0]) if curve else ticket


class ZapAnswer(NamedTuple):
    """The answer to ZAP request ``request`` (its frames before the mechanism): admitted as
    ``user`` (the ZeroMQ User-Id its messages carry), or refused when ``user`` is None."""

    request: Any
    user: bytes | None


@dataclass
class _Ticket:
    session: int
    expires: float
    client: bool  # granted to the session's client: a REQUEST may come too
    user: bytes = b""  # set once admitted; its one message is then awaited


@dataclass
class Admissions:
    """A receiver's tickets: the ZAP answers, and the check of an admitted peer's message."""

    curve: bool
    refused: int = 0  # handshakes and messages dropped: no ticket, a wrong or used one
    _tickets: dict[bytes, _Ticket] = field(default_factory=dict)  # by credential
    _admitted: dict[bytes, bytes] = field(default_factory=dict)  # User-Id -> credential
    _waiting: list[tuple[Any, bytes, float]] = field(default_factory=list)
    _admissions: int = 0

    def expect(self, ticket: bytes, session: int, now: float,
               client: bool = False) -> list[ZapAnswer]:
        """The broker granted a link to ``session`` under ``ticket`` (to its ``client``, or
        to a worker); handshakes that waited for it are answered."""
        if len(self._tickets) >= MAX_TICKETS:
            self._forget(next(iter(self._tickets)))
        key = credential(ticket, self.curve)
        self._tickets[key] = _Ticket(session, now + TICKET_SECONDS, client)
        waited = [w for w in self._waiting if w[1] == key]
        self._waiting = [w for w in self._waiting if w[1] != key]
        return [self._admit(request, key, now) for request, key, _ in waited]

    def on_zap(self, request: Any, mechanism: bytes, credentials: list[bytes],
               now: float) -> list[ZapAnswer]:
        """A peer's handshake: admitted with a fresh ticket, waiting for one not heard of yet,
        refused otherwise."""
        expected = b"CURVE" if self.curve else b"PLAIN"
        if mechanism != expected or not credentials or (
                not self.curve and (len(credentials) != 2 or credentials[0] != LINK_USER)):
            self.refused += 1
            return [ZapAnswer(request, None)]
        key = credentials[-1]
        if key not in self._tickets:
            if len(self._waiting) >= MAX_WAITING:
                self.refused += 1
                return [ZapAnswer(request, None)]
            self._waiting.append((request, key, now + WAIT_SECONDS))
            return []
        return [self._admit(request, key, now)]

    def refuses(self, event: int) -> bool:
        """Whether socket monitor ``event`` of the bulk endpoint is a handshake libzmq
        refused by itself (``HANDSHAKE_REFUSALS``); if so it is counted. Costs no memory,
        however many come."""
        if not event & HANDSHAKE_REFUSALS:
            return False
        self.refused += 1
        return True

    def _admit(self, request: Any, key: bytes, now: float) -> ZapAnswer:
        ticket = self._tickets[key]
        if ticket.user or ticket.expires < now:  # a ticket admits one handshake, in time
            self.refused += 1
            return ZapAnswer(request, None)
        self._admissions += 1
        ticket.user = b"link-%d" % self._admissions
        self._admitted[ticket.user] = key
        return ZapAnswer(request, ticket.user)

    def take(self, user: bytes | None, header: Header | None) -> bool:
        """Whether a message from the peer admitted as ``user`` is the one message its
        ticket allows (then the ticket is spent); False: drop it (counted)."""
        key = self._admitted.pop(user, None) if user else None
        ticket = self._tickets.pop(key, None) if key is not None else None
        allowed = _CLIENT_KINDS if ticket is not None and ticket.client else _WORKER_KINDS
        if ticket is None or header is None or header.kind not in allowed \
                or header.session != ticket.session:
            self.refused += 1
            return False
        return True

    def tick(self, now: float) -> list[ZapAnswer]:
        """Refuse handshakes that waited too long; forget tickets past their time."""
        late = [w for w in self._waiting if w[2] < now]
        self._waiting = [w for w in self._waiting if w[2] >= now]
        self.refused += len(late)
        for key in [k for k, t in self._tickets.items() if t.expires < now]:
            self._forget(key)
        return [ZapAnswer(request, None) for request, _, _ in late]

    def _forget(self, key: bytes) -> None:
        ticket = self._tickets.pop(key)
        self._admitted.pop(ticket.user, None)


class Dial(NamedTuple):
    """Connect link ``link`` to ``address`` (a CURVE server with ``public_key``, if any),
    showing ``ticket``; send its TRANSFER once connected (``Outgoing.connected``)."""

    link: int
    address: str
    public_key: bytes | None
    ticket: bytes


class Fallback(NamedTuple):
    """Send link ``link``'s TRANSFER ``frames`` through the broker (closing its dial, if
    any)."""

    link: int
    frames: list[Any]


@dataclass
class _Pending:
    frames: list[Any]
    deadline: float
    nbytes: int
    address: str = ""  # once granted


@dataclass
class _Sent:
    frames: list[Any]  # kept until acknowledged, to go through the broker if the link breaks
    deadline: float
    address: str
    nbytes: int


@dataclass
class Outgoing:
    """A sender's TRANSFERs waiting for a grant or a connection, then for the receiver's
    word; and the counts of those the receiver took (``sent``, ``sent_bytes``) and of those
    that fell back to the broker."""

    _pending: dict[int, _Pending] = field(default_factory=dict)
    _sent: dict[int, _Sent] = field(default_factory=dict)
    _links: int = 0
    _told: set[str] = field(default_factory=set)  # addresses whose fallback was logged
    _told_broken: set[str] = field(default_factory=set)  # and whose broken link was
    sent: int = 0
    sent_bytes: int = 0
    fallbacks: int = 0

    def start(self, frames: list[Any], header: Header, nbytes: int, now: float) -> Message:
        """A TRANSFER (``frames``, its ``header``) leaves: the LINK request to send."""
        self._links += 1
        self._pending[self._links] = _Pending(frames, now + CONNECT_SECONDS, nbytes)
        return Message(Kind.LINK, header.session, self._links,
                       {"source": header.request, "nbytes": nbytes})

    def on_grant(self, message: Message) -> Dial | Fallback | None:
        """The broker's answer to a LINK request: dial, take the broker, or nothing (an
        answer for a link no longer waiting)."""
        pending = self._pending.get(message.request)
        if pending is None or pending.address:
            return None
        body = message.body
        address, ticket, key = body.get("address"), body.get("ticket"), body.get("public_key")
        if type(address) is not str or type(ticket) is not bytes or len(ticket) != 32 \
                or not (key is None or type(key) is bytes):
            self.fallbacks += 1
            return Fallback(message.request, self._pending.pop(message.request).frames)
        pending.address = address
        return Dial(message.request, address, key, ticket)

    def connected(self, link: int, now: float) -> list[Any] | None:
        """Link ``link`` is connected: its TRANSFER's frames, to send on it (None: it fell
        back meanwhile)."""
        pending = self._pending.pop(link, None)
        if pending is None:
            return None
        self._sent[link] = _Sent(pending.frames, now + ACK_SECONDS, pending.address,
                                 pending.nbytes)
        return pending.frames

    def acknowledged(self, link: int) -> bool:
        """The receiver took link ``link``'s TRANSFER; False where it was not sent on it."""
        sent = self._sent.pop(link, None)
        if sent is None:
            return False
        self.sent += 1
        self.sent_bytes += sent.nbytes
        return True

    def broke(self, link: int) -> Fallback | None:
        """Link ``link`` broke before the receiver's word: its TRANSFER, to send once more
        through the broker (the first break to each address logged); None where nothing was
        sent on it or the receiver took it (a link closed after its word)."""
        sent = self._sent.pop(link, None)
        if sent is None:
            return None
        if sent.address not in self._told_broken:
            self._told_broken.add(sent.address)
            log.warning("the direct link to %s broke before the receiver took its tensor: "
                        "sent again through the broker (so are the next that break there)",
                        sent.address)
        self.fallbacks += 1
        return Fallback(link, sent.frames)

    def unacknowledged(self, now: float) -> list[int]:
        """Links whose TRANSFER went unacknowledged too long: to close (each logged)."""
        late = [link for link, sent in self._sent.items() if sent.deadline < now]
        for link in late:
            del self._sent[link]
            log.warning("a tensor sent over a direct link was not acknowledged within %g s: "
                        "its link is closed", ACK_SECONDS)
        return late

    def tick(self, now: float) -> list[Fallback]:
        """TRANSFERs without a grant and a connection in time: through the broker."""
        late = [link for link, p in self._pending.items() if p.deadline < now]
        fallbacks = []
        for link in late:
            pending = self._pending.pop(link)
            if pending.address not in self._told:
                self._told.add(pending.address)
                log.warning("no direct link to %s within %g s: large tensors moved there "
                            "travel through the broker", pending.address or "the receiving "
                            "worker (no grant)", CONNECT_SECONDS)
            fallbacks.append(Fallback(link, pending.frames))
        self.fallbacks += len(fallbacks)
        return fallbacks

    def clear(self) -> list[Fallback]:
        """A new connection to the broker: what waited for a grant, a connection or the
        receiver's word, dropped here; returned, for a broker that takes over the sessions
        (a pair's) to carry (a copy the receiver took already is dropped there)."""
        waiting = [Fallback(link, pending.frames) for link, pending in self._pending.items()]
        waiting += [Fallback(link, sent.frames) for link, sent in self._sent.items()]
        self._pending.clear()
        self._sent.clear()
        return waiting
