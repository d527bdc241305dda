"""Log lines that any peer can cause at will, folded into one line per interval.

Rule: a peer must not write a broker's or a worker's log at its own pace. A line that an
unauthenticated peer can trigger (a refused token, a malformed message, a message from an
unregistered worker) goes through ``RateLimitedLog``: the first of its kind is logged at once, in
full; the next ones within ``interval`` seconds are only counted, with a bounded sample of the
peers, and reported as one line when the interval ends. Sans I/O: the caller passes ``now``
and logs the ``LogLine`` items it gets back. A kind is a fixed description written in the
code (never a peer's bytes), so the table of kinds stays small. A line that names no peer
(``peer`` empty) says none.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

INTERVAL = 10.0  # seconds over which repeats of one kind are folded into one line
SAMPLE_PEERS = 3  # peers named in a summary line
ADDRESS_CHARS = 64  # characters of a network address shown
DETAIL_CHARS = 200  # of the first line's detail (an error sentence may quote a peer's input)


def peer_label(identity: bytes) -> str:
    """A connection's name in logs and admin views: a short digest of its routing id, never
    the id itself, since a client's sessions are bound to its id (a random secret that only
    it holds: whoever connected under it would reach them)."""
    return hashlib.blake2b(identity, digest_size=8).hexdigest()


class LogLine(NamedTuple):
    """A line for the caller to log, at ``level`` (``logging.WARNING``, say)."""

    level: int
    text: str


def peer_text(peer: bytes | str) -> str:
    """A routing identity as its label (``peer_label``); a network address (a peer in
    the ZeroMQ handshake has no identity yet) as bounded text."""
    if isinstance(peer, str):
        return peer[:ADDRESS_CHARS]
    return peer_label(peer)


@dataclass
class _Spell:
    """One kind's current interval: what was held back since its last line."""

    level: int
    started: float
    count: int = 0
    peers: list[str] = field(default_factory=list)  # the first SAMPLE_PEERS distinct ones
    more_peers: bool = False  # others sent some too


class RateLimitedLog:
    """Per-kind counts of repeated lines; ``note`` each occurrence, log what ``due`` returns."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._spells: dict[str, _Spell] = {}  # kind -> its interval, while it repeats

    def note(self, level: int, kind: str, peer: bytes | str, now: float,
             detail: str = "") -> LogLine | None:
        """One occurrence of ``kind`` from ``peer``: the line to log now (the first in a
        quiet interval), or None when it is counted for the summary."""
        spell = self._spells.get(kind)
        if spell is None:
            self._spells[kind] = _Spell(level, now)
            text = f"{kind} (peer {peer_text(peer)})" if peer else kind
            return LogLine(level, f"{text}: {detail[:DETAIL_CHARS]}" if detail else text)
        spell.count += 1
        if spell.more_peers or not peer:  # (a full sample said so: a flood pays no digest)
            return None
        name = peer_text(peer)
        if name not in spell.peers:
            if len(spell.peers) < SAMPLE_PEERS:
                spell.peers.append(name)
            else:
                spell.more_peers = True
        return None

    def due(self, now: float) -> list[LogLine]:
        """The summary of each kind whose interval has ended with repeats; a kind that stayed
        quiet for a whole interval is forgotten, so its next occurrence is logged at once."""
        lines: list[LogLine] = []
        for kind, spell in list(self._spells.items()):
            if now - spell.started < self.interval:
                continue
            if spell.count == 0:
                del self._spells[kind]
                continue
            peers = ", ".join(spell.peers) + (" and others" if spell.more_peers else "")
            lines.append(LogLine(spell.level, f"{kind}: {spell.count} more in the last "
                                              f"{now - spell.started:.0f} s"
                                              + (f" (peers {peers})" if peers else "")))
            self._spells[kind] = _Spell(spell.level, now)
        return lines
