"""Flow limits shared by broker, worker and client: default sizes, and bounded parking.

Rule: no hop ever drops a message because the next socket is full, and no hop grows
without bound. A message that a socket cannot take yet (``EAGAIN`` on a non-blocking send)
is parked, in order, in its destination's bounded queue in an ``Outbox``; the owner stops
reading whatever feeds a destination whose queue is full, and retries the queue until it
drains. What happens to a destination that never drains is the owner's policy (the broker
cuts a client that does not read its replies, and loses a worker whose queue stays full for
``slow_peer_timeout`` seconds). The ``Outbox`` is sans I/O: sends are done by a callable.

Why a stalled destination cannot be waited for long: a client heartbeats its connection
(libzmq's ``HEARTBEAT_IVL``/``HEARTBEAT_TIMEOUT``, ``CLIENT_HEARTBEAT_MS`` and
``CLIENT_HEARTBEAT_TIMEOUT_MS``), and while the broker does not read it (the queue behind it
is full) its PINGs go unanswered, so the client drops the connection, and its queued
messages with it, after the timeout (libzmq #3937 and PR #4830 describe the mechanism). So
the broker may pause its frontend only for less than that; its default
``slow_peer_timeout`` is 2/3 of it. (The broker runs no such heartbeat itself: a device's
lane goes unread while it computes, and towards clients libzmq 4.3.5 can abort on it, see
``broker.server``.)

``MAXMSGSIZE`` in libzmq limits each frame, not the sum of a message's frames, and a peer
that sends a bigger frame is disconnected without a word; so every sender checks the frames
it makes (an uploaded or read array is one frame) against the limit of every socket on the
way, and raises ``MessageTooLarge`` instead. What a message holds in all, before its server
reads it, is bounded per connection (``connection_bytes_limit``, enforced by
``fabric.core.intake``): libzmq holds a message whole before its first frame can be read.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Hashable, Sequence

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30  # the largest frame (one array) any fabric socket takes
DEFAULT_HWM = 1000  # SNDHWM and RCVHWM, in messages, per peer, on every fabric socket
DEFAULT_PEER_QUEUE = 1000  # messages the broker parks for one peer whose queue is full
DEFAULT_MAX_SESSIONS_PER_CLIENT = 256  # per client connection (a DEALER identity)
DEFAULT_MAX_SESSIONS_PER_DEVICE = 1024
# A broker pair's state heartbeats (broker.pair): the ZeroMQ guide's Binary Star values.
DEFAULT_PAIR_HEARTBEAT = 1.0  # seconds between them
DEFAULT_PAIR_LIVENESS = 2  # missed before the peer counts as gone
# A takeover's sessions (``fabric.core.resume``): a worker keeps them this long for the broker
# that takes over, which keeps the reported ones as long for their clients.
DEFAULT_RESUME_GRACE = 30.0
# A client flushes its op batch at MAX_BATCH_ENTRIES entries or once its uploaded buffers
# reach MAX_BATCH_BYTES (``fabric.arrays.stream`` says why these sizes). That bounds one message,
# which libzmq does not: it holds a multipart message whole before the broker sees it and
# bounds only each frame (MAXMSGSIZE), never their count or sum. The broker refuses, with
# MessageTooLarge, a message with more frames or bytes than a fabric peer ever sends.
MAX_BATCH_ENTRIES = 512
# A device's settings' "compiles" for one that runs a batch it has seen before as one compiled
# executable (the client then sends larger batches: ``fabric.arrays.stream``)
COMPILES_BATCHES = "graphs and batches"
MAX_BATCH_BYTES = 4 << 20
MAX_MESSAGE_FRAMES = 2 + MAX_BATCH_ENTRIES  # a header, a body, a buffer per entry at most


def message_bytes_limit(max_message_bytes: int) -> int:
    """The most bytes one message may carry when each frame may carry ``max_message_bytes``:
    a body, and a batch's uploads (under MAX_BATCH_BYTES before its last, which may be one
    frame's worth)."""
    return 2 * max_message_bytes + MAX_BATCH_BYTES


def connection_bytes_limit(max_message_bytes: int) -> int:
    """The most bytes a server lets one connection hold that it has not read yet, when each
    frame may carry ``max_message_bytes``: the largest message (``message_bytes_limit``) in
    progress, behind a client's credit window of batches waiting (SUBMIT_WINDOW batches of
    MAX_BATCH_BYTES), which a server that pauses its reading (backpressure) lets queue. Past
    it the connection is cut (``fabric.core.intake``)."""
    return message_bytes_limit(max_message_bytes) + SUBMIT_WINDOW * MAX_BATCH_BYTES


# Credit: a client has at most SUBMIT_WINDOW of a session's SUBMITs sent and not yet run by
# the device, which says how many it has run (CREDIT) every CREDIT_EVERY. A client that
# streams faster than its device computes then waits for the device, instead of filling
# every queue on the way until the broker must lose the worker (the window is far below
# DEFAULT_HWM and DEFAULT_PEER_QUEUE), and one session cannot crowd the others' queues.
SUBMIT_WINDOW = 64
CREDIT_EVERY = 16
# A client's libzmq heartbeat to the broker: how it finds a silent or stopped broker (see above
# for what it means for how long the broker may pause its frontend).
CLIENT_HEARTBEAT_MS = 1000
CLIENT_HEARTBEAT_TIMEOUT_MS = 3000

# A move's TRANSFER this small (its bytes by memory or through a slot, or few) may come before
# the receiving device agreed to take it (``expect``) and wait there for its ticket: the
# client sends a move's three messages at once, where a larger one waits for the agreement
# first (``workers.session_moves``, ``fabric.transport.moves``)
EARLY_TRANSFER_BYTES = 64 << 10


def largest_frame(frames: Sequence[Any]) -> int:
    """The size in bytes of the biggest frame (what ``MAXMSGSIZE`` is compared with)."""
    return max(map(len, frames)) if frames else 0  # (default= would cost as much again)


def size_text(count: int) -> str:
    """A byte count for a sentence: ``1.0 GiB``, ``512.0 KiB``, ``10 bytes``."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def bytes_text(count: int) -> str:
    """A byte count for a sentence that people read and programs may parse: in binary units
    with the exact count beside it (``5.7 GiB (6,123,456,789 bytes)``; ``10 bytes``)."""
    words = size_text(count)
    return words if words.endswith(" bytes") else f"{words} ({count:,} bytes)"


def size_and_limit_text(size: int, limit: int) -> tuple[str, str]:
    """A size and the limit it is compared with, for one sentence: as ``size_text``, with the
    exact bytes in parentheses when both would round to the same figure (``1.0 GiB`` would
    otherwise read as more than ``1.0 GiB``)."""
    size_words, limit_words = size_text(size), size_text(limit)
    if size_words == limit_words and size != limit:
        return f"{size_words} ({size} bytes)", f"{limit_words} ({limit} bytes)"
    return size_words, limit_words


class Outbox:
    """Messages parked per destination, in arrival order, each queue bounded.

    A destination is "full" once it holds ``limit`` messages or ``limit_bytes`` bytes (one
    message is always admitted, however big), and stays full until it drains to half of
    both: the hysteresis keeps a paused reader from flapping. ``full_since`` tells the owner
    how long a destination has been full.
    """

    def __init__(self, limit: int, limit_bytes: int) -> None:
        if limit < 1 or limit_bytes < 1:
            raise ValueError("Outbox limits must be at least 1.")
        self.limit = limit
        self.limit_bytes = limit_bytes
        self._queues: dict[Hashable, deque[tuple[Sequence[Any], int]]] = {}
        self._bytes: dict[Hashable, int] = {}
        self.full_since: dict[Hashable, float] = {}
        self.messages = 0  # parked now, over every destination
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._queues

    def __len__(self) -> int:
        """How many destinations have parked messages."""
        return len(self._queues)

    def keys(self) -> list[Hashable]:
        """The destinations with parked messages, oldest first."""
        return list(self._queues)

    def queued(self, key: Hashable) -> int:
        """Messages parked for ``key``."""
        queue = self._queues.get(key)
        return len(queue) if queue else 0

    def parked(self, key: Hashable) -> list[Sequence[Any]]:
        """The messages parked for ``key``, oldest first (not removed)."""
        return [frames for frames, _ in self._queues.get(key, ())]

    def park(self, key: Hashable, frames: Sequence[Any], now: float) -> bool:
        """Park a message behind any already parked for ``key``; True if ``key`` is full."""
        size = sum(len(frame) for frame in frames)
        self._queues.setdefault(key, deque()).append((frames, size))
        self._bytes[key] = self._bytes.get(key, 0) + size
        self.messages += 1
        self.bytes += size
        if key not in self.full_since and (len(self._queues[key]) >= self.limit
                                           or self._bytes[key] >= self.limit_bytes):
            self.full_since[key] = now
        return key in self.full_since

    def is_full(self, key: Hashable) -> bool:
        """Whether ``key`` filled up and has not yet drained to half."""
        return key in self.full_since

    def flush(self, key: Hashable, send: Callable[[Sequence[Any]], bool]) -> bool:
        """Send ``key``'s messages in order until ``send`` returns False (the socket is full
        again); True when the queue is empty. Exceptions from ``send`` propagate, and the
        message that raised stays parked."""
        queue = self._queues.get(key)
        while queue:
            if not send(queue[0][0]):
                return False
            self.take(key)
        return True

    def take(self, key: Hashable) -> Sequence[Any]:
        """Remove and return the oldest message parked for ``key`` (there must be one)."""
        queue = self._queues[key]
        frames, size = queue.popleft()
        self._bytes[key] -= size
        self.messages -= 1
        self.bytes -= size
        if (key in self.full_since and len(queue) <= self.limit // 2
                and self._bytes[key] <= self.limit_bytes // 2):
            del self.full_since[key]
        if not queue:
            self._forget(key)
        return frames

    def discard(self, key: Hashable) -> int:
        """Throw away ``key``'s parked messages (its peer is gone); how many there were."""
        queue = self._queues.get(key)
        count = len(queue) if queue else 0
        if queue:
            self.messages -= count
            self.bytes -= self._bytes[key]
        self._forget(key)
        return count

    def replace(self, key: Hashable, messages: list[Sequence[Any]], now: float) -> None:
        """Park exactly ``messages`` for ``key`` (dropping what was parked), unbounded: for
        the few last words to a peer that was cut off."""
        self.discard(key)
        for frames in messages:
            self.park(key, frames, now)
        self.full_since.pop(key, None)

    def clear(self) -> None:
        """Throw away everything."""
        for key in list(self._queues):
            self.discard(key)

    def _forget(self, key: Hashable) -> None:
        self._queues.pop(key, None)
        self._bytes.pop(key, None)
        self.full_since.pop(key, None)
