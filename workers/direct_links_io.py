"""A worker's direct links, their I/O: its bulk endpoint, its ZAP handler, its dials.

Rule: thin. What is admitted, what a message may carry and when a sender gives up are
``workers.direct_links``' decisions; this module owns the sockets and runs in the worker's control
thread, which polls them with its own. The bulk endpoint is a ROUTER on a free port of the
address this worker is reached at; a PLAIN server (a CURVE server with the worker's own key
when the cluster uses CURVE) whose every handshake this worker's ZAP handler answers, so no
byte of a peer without a ticket is taken. Each granted TRANSFER gets its own DEALER, which
shows the ticket, sends once connected and closes when the receiver acknowledges (or gives
up, ``workers.direct_links``); its socket monitor tells when its connection closes, and TCP's own
deadline (``TCP_MAXRT``: ``LINK_STALL_SECONDS``) closes one whose bytes stop being taken, so a
link that breaks mid-send is noticed in bounded time and its TRANSFER goes through the broker.
The endpoint's heartbeat closes a connection whose one message does not complete while its
ticket lasts, so a broken sender's partial message is freed; TCP's deadline closes one whose
read reply stalls. What a connection holds before its message is whole is bounded
(``fabric.core.intake``: libzmq holds a message whole, and bounds only its frames): one that holds
more than the largest message (``message_bytes_limit``) is cut, and so is one that sends a
message its ticket does not allow (after its one message, say), so it can send no more. An
admitted TRANSFER goes to its device as one moved between two devices of this worker does; a
client's admitted read goes to its device too, and the reply comes back here, to go out on
the link it came by. The endpoint's socket monitor reports the handshakes libzmq refuses
before any ZAP request (a peer without credentials): counted with the rest, and logged at
most once an interval (``RateLimitedLog``: any peer can cause them); so are the messages an
admitted peer sends past the one its ticket allows, and the replies to reads whose client
left. The monitor also names the endpoint's connections, for ``fabric.core.intake``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from typing import Any, Callable
from urllib.parse import urlsplit

import zmq

from fabric.core import protocol, zap_messages as zap
from fabric.core.errors import FabricError
from fabric.core.flow import message_bytes_limit
from fabric.core.intake import MONITORED, Intake
from fabric.core.log_limit import RateLimitedLog
from fabric.core.protocol import Kind, LinkReport, Message
from fabric.core.security import LINK_STALL_SECONDS, CurveClient, show_ticket
from fabric.core.sockets import recv_frames, recv_monitor_event, try_send

from .direct_links import (HANDSHAKE_REFUSALS, TICKET_SECONDS, Admissions, Dial, Fallback,
                           Outgoing, ZapAnswer)

log = logging.getLogger("fabric.worker")

_BULK_HWM = 4  # admitted messages the bulk endpoint holds before the loop reads them


def reachable_host(broker: str) -> str | None:
    """The address of this machine that reaches ``broker`` (the interface its route uses),
    where the broker is a ``tcp://`` address on another interface than loopback; None for a
    broker on loopback (its workers and clients share this host, and its memory: that is
    their path) and for ``ipc://`` and the like."""
    parts = urlsplit(broker)
    if parts.scheme != "tcp" or not parts.hostname:
        return None
    try:
        family, _, _, _, where = socket.getaddrinfo(parts.hostname, parts.port or 1,
                                                    type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)  # (UDP: no packet is sent; the kernel picks the route)
            host = probe.getsockname()[0]
    except OSError:
        return None
    return None if ipaddress.ip_address(host.split("%")[0]).is_loopback else host


class BulkLinks:
    """The bulk endpoint at ``host`` (its port chosen free) and the dials of this worker."""

    def __init__(self, context: zmq.Context, host: str, curve: CurveClient | None,
                 max_message_bytes: int, to_device: Callable[[list[zmq.Frame]], None],
                 read: Callable[[bytes, list[zmq.Frame]], None]) -> None:
        self.admissions = Admissions(curve is not None)
        self.outgoing = Outgoing()
        self._context = context
        self._curve = curve
        self._to_device = to_device  # an admitted TRANSFER's way to its device
        self._read = read  # an admitted read's, with the link's routing id for the reply
        self._dials: dict[int, tuple[zmq.Socket, zmq.Socket]] = {}  # link -> socket, monitor
        self._link_of: dict[zmq.Socket, int] = {}  # a dial's socket or monitor -> its link
        self._broken: list[Fallback] = []  # TRANSFERs of links that broke, for tick()
        self.received = self.received_bytes = 0  # TRANSFERs taken on the endpoint
        self._poller: zmq.Poller | None = None
        self.zap = context.socket(zmq.ROUTER)
        self.zap.linger = 0
        self.zap.bind(zap.ZAP_ENDPOINT)
        self.endpoint = context.socket(zmq.ROUTER)
        for option, value in ((zmq.LINGER, 0), (zmq.MAXMSGSIZE, max_message_bytes),
                              (zmq.RCVHWM, _BULK_HWM), (zmq.IPV6, ":" in host),
                              (zmq.HEARTBEAT_IVL, int(TICKET_SECONDS * 1000)),
                              (zmq.HEARTBEAT_TIMEOUT, int(TICKET_SECONDS * 1000)),
                              (zmq.TCP_MAXRT, int(LINK_STALL_SECONDS * 1000))):
            self.endpoint.setsockopt(option, value)
        if curve is not None:
            self.endpoint.curve_secretkey = curve.secret_key
            self.endpoint.curve_publickey = curve.public_key
            self.endpoint.curve_server = True
        else:
            self.endpoint.plain_server = True
        self.monitor = self.endpoint.get_monitor_socket(HANDSHAKE_REFUSALS | MONITORED)
        self._refusal_log = RateLimitedLog()
        where = f"[{host}]" if ":" in host else host
        self.address = f"tcp://{where}:{self.endpoint.bind_to_random_port(f'tcp://{where}')}"
        # What a connection holds before its one message is whole: the largest message.
        self.intake = Intake(self.endpoint, message_bytes_limit(max_message_bytes))
        log.info("direct links at %s", self.address)

    def report(self) -> LinkReport:
        """What the links carried so far, for the worker's heartbeat report."""
        out = self.outgoing
        return LinkReport(out.sent, out.sent_bytes, self.received, self.received_bytes,
                          out.fallbacks)

    def advertised(self) -> dict[str, Any]:
        """What REGISTER says of the endpoint (``bulk``)."""
        key = {"public_key": self._curve.public_key} if self._curve is not None else {}
        return {"address": self.address, **key}

    def watch(self, poller: zmq.Poller) -> list[Fallback]:
        """Poll the endpoint, the ZAP handler and the dials with ``poller`` (a new
        connection to the broker's); the TRANSFERs that waited, their dials closed: to send
        through the new broker where it takes the sessions over, else to drop."""
        for link in list(self._dials):  # (registered with the old poller)
            self._close_dial(link)
        waiting = self._broken + self.outgoing.clear()
        self._broken = []
        self._poller = poller
        for sock in (self.zap, self.endpoint, self.monitor):
            poller.register(sock, zmq.POLLIN)
        return waiting

    def owns(self, sock: zmq.Socket) -> bool:
        """Whether ``sock`` is one of this module's (for the loop's dispatch)."""
        return sock is self.zap or sock is self.endpoint or sock is self.monitor \
            or sock in self._link_of

    def send(self, frames: list[zmq.Frame], nbytes: int) -> Message:
        """A large TRANSFER leaves: the LINK request to send to the broker."""
        return self.outgoing.start(frames, protocol.decode_header(frames[0]), nbytes,
                                   time.monotonic())

    def from_broker(self, message: Message) -> list[Fallback]:
        """A LINK_GRANT (dial, or fall back) or a LINK_EXPECT (admit a ticket)."""
        if message.kind == Kind.LINK_EXPECT:
            self._answer(self.admissions.expect(message.body["ticket"], message.session,
                                                time.monotonic(),
                                                client=message.body.get("client") is True))
            return []
        action = self.outgoing.on_grant(message)
        if type(action) is Dial:
            self._dial(action)
            return []
        return [action] if action is not None else []

    def on_ready(self, sock: zmq.Socket) -> None:
        """``sock`` (one of ``owns``) is ready."""
        now = time.monotonic()
        if sock is self.zap:
            routing, *frames = recv_frames(sock)
            try:
                request = zap.parse_request(frames)
            except ValueError:
                self.zap.send_multipart([routing, *zap.reply(b"", zap.FAILED, "malformed")])
                return
            self._answer(self.admissions.on_zap((routing, request.request_id),
                                                request.mechanism.encode(),
                                                list(request.credentials), now))
        elif sock is self.monitor:
            event = recv_monitor_event(sock)
            if event["event"] & MONITORED:  # a connection accepted, or gone
                self.intake.on_event(event["event"], event["value"])
            elif self.admissions.refuses(event["event"]):
                self._log_peer("direct link: a handshake refused before any ticket was shown "
                               "(no credentials, or another mechanism)", now)
        elif sock is self.endpoint:
            received = recv_frames(sock)
            self.intake.took(received)
            routing, *frames = received
            try:  # (an admitted peer's message always has a header, and a User-Id)
                header = protocol.decode_header(frames[0])
                user = frames[0].get("User-Id").encode()
            except (FabricError, zmq.ZMQError, IndexError):
                header = user = None
            if not self.admissions.take(user, header):
                self.intake.cut_sender(received, now)  # (it may send nothing more)
                self._log_peer("direct link: dropped a message its ticket does not allow, "
                               "and cut its connection", now)
            elif header.kind == Kind.REQUEST:  # a client's read, answered on its link
                self._read(routing, frames)
            else:
                try_send(self.endpoint, [routing, b""])  # (the sender's word that it may close)
                self.received += 1
                self.received_bytes += sum(len(frame) for frame in frames[1:])
                self._to_device(frames)
        else:
            link = self._link_of[sock]
            if sock is not self._dials[link][0]:  # its monitor (only DISCONNECTED is asked for)
                recv_monitor_event(sock)
                fallback = self.outgoing.broke(link)
                if fallback is not None:
                    self._close_dial(link)
                    self._broken.append(fallback)
                return
            if self.outgoing.acknowledged(link):
                self._close_dial(link)
                return
            frames = self.outgoing.connected(link, now)
            if frames is None:
                self._close_dial(link)
                return
            sock.send_multipart(frames, copy=False)
            self._poller.modify(sock, zmq.POLLIN)  # (then wait for the receiver's word)

    def reply(self, routing: bytes, frames: list[zmq.Frame]) -> None:
        """Answer a read that came on a link, on that link."""
        if not try_send(self.endpoint, [routing, *frames]):
            self._log_peer("direct link: a read's reply was dropped (its client is gone)",
                           time.monotonic(), detail="")

    def wait_ms(self, now: float) -> float:
        """How long the loop may wait before ``tick`` has work (the intake's next check)."""
        return max(0.0, self.intake.due() - now) * 1000

    def tick(self) -> list[Fallback]:
        """Refuse handshakes that waited too long, cut connections that hold too much; the
        TRANSFERs that fall back."""
        now = time.monotonic()
        if now >= self.intake.due():
            for cut in self.intake.check(now):
                self._log_peer(f"direct link: a connection held more than "
                               f"{self.intake.ledger.limit} bytes unread (a message bigger "
                               "than a transfer): cut", now, f"{cut.held} bytes held")
        self._answer(self.admissions.tick(now))
        for line in self._refusal_log.due(now):
            log.log(*line)
        fallbacks = self.outgoing.tick(now)
        for link in [f.link for f in fallbacks] + self.outgoing.unacknowledged(now):
            self._close_dial(link)
        broken, self._broken = self._broken, []
        return broken + fallbacks

    def close(self) -> None:
        """Close every socket; sends under way on a link end."""
        for link in list(self._dials):
            self._close_dial(link)
        self.zap.close(linger=0)
        self.endpoint.disable_monitor()
        self.monitor.close(linger=0)
        self.endpoint.close(linger=0)

    def _dial(self, dial: Dial) -> None:
        sock = self._context.socket(zmq.DEALER)
        show_ticket(sock, dial.ticket, dial.public_key)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(dial.address)
        self._dials[dial.link] = (sock, monitor)
        self._link_of[sock] = self._link_of[monitor] = dial.link
        self._poller.register(sock, zmq.POLLOUT)
        self._poller.register(monitor, zmq.POLLIN)

    def _close_dial(self, link: int) -> None:
        dial = self._dials.pop(link, None)
        if dial is None:
            return
        sock, monitor = dial
        for closing in dial:
            del self._link_of[closing]
            self._poller.unregister(closing)
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)

    def _log_peer(self, kind: str, now: float, detail: str | None = None) -> None:
        """Log a line any peer can cause at will (``kind``: fixed words; ``detail`` by
        default how many were refused), through the rate limit: the first of an interval at
        once, the next ones summed up by ``tick``."""
        if detail is None:
            detail = f"{self.admissions.refused} refused in all"
        line = self._refusal_log.note(logging.WARNING, kind, "not named by libzmq", now, detail)
        if line is not None:
            log.log(*line)

    def _answer(self, answers: list[ZapAnswer]) -> None:
        for answer in answers:
            routing, request_id = answer.request
            status = zap.ALLOWED if answer.user is not None else zap.REFUSED
            self.zap.send_multipart([routing, *zap.reply(
                request_id, status, "OK" if answer.user else "no ticket",
                (answer.user or b"").decode())])
