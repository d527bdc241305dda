"""The broker's flow control, sans I/O: what happens to a message a peer's queue cannot take.

Rule: a peer whose queue is full (``EAGAIN``) never costs another peer a message. What is sent
to it waits in its own bounded queue in an ``Outbox`` (``fabric.core.flow``), and the I/O loop
retries the queues every pass. When a worker's parked queue fills, the frontend (the source of
what is sent to workers) is not read while ``blocking`` lists a worker, until its queue drains
to half: clients' own send queues fill and their sends wait (backpressure); a worker that
stays full ``Limits.slow_worker_timeout`` seconds is lost like a dead one. A client's queue
fills only with answers to what it asked and did not read, so a client whose queue fills is
cut off: its sessions end (freeing their memory on the workers) and a notice is parked in
place of the rest; until it reads them, anything else for it (answers about sessions it no
longer has) is dropped and counted. A parked peer that stays unreachable longer than a
heartbeat interval is gone (libzmq also calls a peer unreachable that was full and has just
read, until the ROUTER learns it did).

Nothing here reads the clock or touches a socket: the loop passes ``now`` and a function that
tries one send, and sends the ``Send`` items returned (the registry's answers to a cut client,
a lost worker, a vanished peer).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from fabric.core import protocol
from fabric.core.flow import Outbox
from fabric.core.protocol import Kind

from .model import Limits, Send, Side
from .registry import Registry

log = logging.getLogger("fabric.broker")

Peer = tuple[Side, bytes]


class PeerUnreachable(Exception):
    """Raised by the loop's send function: the socket has no such peer (``EHOSTUNREACH``)."""


def is_notice(frames: Sequence[Any]) -> bool:
    """Whether a parked message tells a client a session ended (an ERROR about a session
    that answers no request): worth keeping when the rest is thrown away."""
    header = protocol.decode_header(frames[0])  # the broker's own message: a valid header
    return header.kind == Kind.ERROR and header.session != 0 and header.request == 0


class FlowControl:
    """Parked messages per peer, and the cut / pause / lose policy over them."""

    def __init__(self, registry: Registry, limits: Limits) -> None:
        self.outbox = Outbox(limits.peer_queue, limits.max_message_bytes)
        self._registry = registry
        self._counters = registry.counters
        self._heartbeat = limits.heartbeat
        self._slow_worker_timeout = limits.slow_worker_timeout
        # Workers whose parked queue is full: while there are any, the frontend is not read.
        self.blocking: set[Peer] = set()
        self._cut: set[bytes] = set()  # clients cut off whose last words are still parked
        self._unreachable_since: dict[Peer, float] = {}  # parked peers

    def figures(self) -> dict[str, Any]:
        """Flow control now, for the admin ``status``."""
        return {"parked_messages": self.outbox.messages, "parked_bytes": self.outbox.bytes,
                "peers_waiting": len(self.outbox), "frontend_paused": bool(self.blocking)}

    def on_queue_full(self, side: Side, identity: bytes, frames: list[Any],
                      now: float) -> list[Send]:
        """A send found the peer's queue full (``EAGAIN``): park it."""
        self._counters[f"{side.value}_send_queue_full"] += 1
        return self.park(side, identity, frames, now)

    def park(self, side: Side, identity: bytes, frames: list[Any], now: float) -> list[Send]:
        """Park a message behind any already parked for its peer; what the registry says if
        that fills the peer's parked queue (the loop sends it)."""
        key = (side, identity)
        if side is Side.FRONTEND and identity in self._cut:
            self._counters["dropped_for_cut_clients"] += 1
            return []
        self._counters["messages_parked"] += 1
        if not self.outbox.park(key, frames, now):
            return []
        if side is Side.FRONTEND:
            return self._cut_client(key, now)
        if key not in self.blocking:
            self.blocking.add(key)
            self._counters["frontend_pauses"] += 1
            log.warning("worker %s is not reading: %d messages wait for it; not reading "
                        "the frontend until it drains", self._registry.worker_name(identity),
                        self.outbox.queued(key))
        return []

    def _cut_client(self, key: Peer, now: float) -> list[Send]:
        """Its last words stay parked: the notices already parked (why a session ended), and
        one for each session it still had; its other messages are dropped."""
        kept = [frames for frames in self.outbox.parked(key) if is_notice(frames)]
        sends = self._registry.cut_client(key[1], self.outbox.queued(key), now)
        self.outbox.replace(key, kept + [s.frames for s in sends
                                         if (s.side, s.identity) == key], now)
        self._cut.add(key[1])
        return [s for s in sends if (s.side, s.identity) != key]

    def retry(self, now: float, send: Callable[[Peer, Sequence[Any]], bool]) -> list[Send]:
        """Send what is parked, in order, as far as each peer's queue takes it (``send``
        returns False when it is full, raises ``PeerUnreachable`` when the peer is not
        there); resume the frontend when blocking workers drained; lose workers that stayed
        full too long and peers that stayed unreachable."""
        followups: list[Send] = []
        for key in self.outbox.keys():
            try:
                self.outbox.flush(key, lambda frames, key=key: send(key, frames))
            except PeerUnreachable:
                since = self._unreachable_since.setdefault(key, now)
                if now - since > self._heartbeat:
                    self._discard(key)  # gone: its own messages go with it
                    followups += self._registry.unroutable(key[0], key[1], now)
            else:
                self._unreachable_since.pop(key, None)  # it took them, or is merely full
            if key[0] is Side.FRONTEND and key not in self.outbox:
                self._cut.discard(key[1])  # it read its last words (or is gone)
        for key in list(self.blocking):
            if not self.outbox.is_full(key):
                self.blocking.discard(key)
            elif now - self.outbox.full_since[key] > self._slow_worker_timeout:
                self.blocking.discard(key)
                self._discard(key)
                self._counters["slow_workers_lost"] += 1
                followups += self._registry.lose_worker(
                    key[1], f"took none of the messages sent to it for "
                            f"{self._slow_worker_timeout:g} s")
        return followups

    def _discard(self, key: Peer) -> None:
        self.outbox.discard(key)
        self._unreachable_since.pop(key, None)
