"""What a listening socket's connections have handed libzmq and it has not delivered yet, and
the bound on it: a message is bounded in total before it is read into memory.

Rule: a peer, token or not, never makes a server hold more than ``limit`` bytes of what it
sent and the server has not read. libzmq cannot say so itself: ``MAXMSGSIZE`` bounds each
frame (``v2_decoder_t::size_ready`` compares one frame's size with it), and libzmq holds a
multipart message whole before the application sees any of it (ZMTP delivers a message
atomically: its frames wait in the pipe, unflushed, until the last one has come; so reading
frame by frame with ``RCVMORE`` does not help either). Twelve frames of 256 MiB, each under a
1 GiB frame limit, were 3 GiB in the broker before the first could be refused.

What bounds it is the kernel's own count, per TCP connection: the bytes libzmq has taken
from it (``TCP_INFO``'s ``tcpi_bytes_received``, less what still waits unread, ``FIONREAD``)
against the bytes of the messages delivered from it (each received frame's ``SRCFD`` says
which connection it came by), each frame credited ``FRAME_CREDIT`` bytes more than it holds
and each connection ``IDLE_CREDIT`` a second (more than ZMTP's framing and heartbeats take),
so that the difference never counts more than libzmq holds. Its rise since its lowest is
what the connection holds: a message in progress and any complete ones not yet read. A
connection past ``limit`` is cut (``shutdown`` of its socket: libzmq sees it close, and frees
what it held), the peer told nothing (no fabric peer ever sends such a message; the partial
message has no request to answer), the cut counted and logged by the owner. Connections are
found from the socket monitor's ``EVENT_ACCEPTED`` (its value is the descriptor) and from
delivered messages, each kept only once it proves to be a connection accepted by this socket
(its local port); a descriptor is known by its inode, so one libzmq closed and reused is
never taken for the old connection.

Each connection's peer is known too, by the routing id its messages came with: the owner
learns whose connection closed from ``on_event``.

Checks run every ``INTERVAL`` seconds (longer with many connections, so that they cost the
loop at most ``CHECK_SHARE`` of its time), at once for a connection just accepted (it alone),
and every ``WATCH_INTERVAL`` for connections past a quarter of the bound: the bound holds
within what a peer sends in one interval. Sans I/O
but for ``Intake``'s probe and cut of a descriptor; the owner feeds it monitor events,
delivered messages and the clock. Only ``tcp://`` connections are measured (a Unix socket
has no such count: an ``ipc://`` endpoint is reached only by local users the file's mode
admits).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import zmq

INTERVAL = 0.05  # seconds between checks of every connection
WATCH_INTERVAL = 0.005  # between checks of the connections past a quarter of the bound
CHECK_SHARE = 0.02  # of the loop's time that checks may take, at most (many connections)
PROBE_SECONDS = 8e-6  # what one connection's check costs (measured: about 6 µs)
FRAME_CREDIT = 64  # bytes a delivered frame is credited beyond its own (ZMTP, CURVE: < 50)
IDLE_CREDIT = 64  # bytes a connection is credited a second (its ZMTP heartbeats: < 50)
HANDSHAKE_CREDIT = 4096  # bytes its greeting and handshake may take (some hundreds)
MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
SRCFD = int(zmq.SRCFD)
_BYTES_RECEIVED = struct.Struct("=Q")  # tcp_info's tcpi_bytes_received, at offset 128
_TCP_INFO_BYTES = 136
_UNREAD = struct.Struct("=i")


class Reading(NamedTuple):
    """A connection's descriptor, read: its socket's inode, and the bytes libzmq took."""

    inode: int
    taken: int


class Cut(NamedTuple):
    """A connection cut: its peer's address and the bytes it held."""

    peer: str
    held: int


@dataclass
class _Connection:
    inode: int
    peer: str
    seen: float  # when it was last credited its idle allowance
    credited: int = HANDSHAKE_CREDIT  # bytes of its messages delivered, and allowances
    lowest: int = 0  # the lowest of (taken - credited) seen: it started at 0 or less
    held: int = 0  # (taken - credited) - lowest at the last check


@dataclass
class IntakeLedger:
    """The accounts of one listening socket's connections, sans I/O: ``probe(fd)`` reads a
    descriptor (None: not a connection of this socket, or gone), ``cut(fd, inode)`` closes
    one; ``limit`` is the bound in bytes."""

    limit: int
    probe: Callable[[int], tuple[Reading, str] | None]
    cut: Callable[[int, int], bool]
    connections: dict[int, _Connection] = field(default_factory=dict)  # by descriptor
    credits: dict[int, int] = field(default_factory=dict)  # delivered since the last check
    found: set[int] = field(default_factory=set)  # accepted, not yet probed
    peers: dict[int, bytes] = field(default_factory=dict)  # by descriptor: its routing id
    next_check: float = 0.0
    next_watch: float = float("inf")
    cuts: int = 0

    def took(self, frames: Sequence[Any]) -> None:
        """A message was delivered (``frames`` as received, the routing id's included)."""
        fd = frames[0].get(SRCFD)
        credits = self.credits
        credits[fd] = credits.get(fd, 0) + sum(map(len, frames)) + FRAME_CREDIT * len(frames)
        if fd not in self.peers:  # (its first message: who sent it, until it closes)
            self.peers[fd] = frames[0].bytes

    def on_event(self, event: int, fd: int) -> bytes | None:
        """A socket monitor event of the listening socket (``value``: a descriptor); for a
        connection gone, the routing id of its peer where a message of it was delivered."""
        if event == zmq.EVENT_ACCEPTED:
            self.found.add(fd)  # (probed at the next check, which is now: ``due``)
        elif event & (zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED):
            self.connections.pop(fd, None)
            self.found.discard(fd)
            return self.peers.pop(fd, None)
        return None

    def cut_sender(self, frames: Sequence[Any], now: float) -> bool:
        """Cut the connection a message (``frames``, as received) came by: its sender may
        send nothing more (True once cut)."""
        fd = frames[0].get(SRCFD)
        if fd not in self.connections:
            self._discover(fd, now)
        connection = self.connections.pop(fd, None)
        if connection is None or not self.cut(fd, connection.inode):
            return False
        self.cuts += 1
        return True

    def due(self) -> float:
        """When ``check`` has work next (at once for connections just accepted)."""
        return 0.0 if self.found else min(self.next_check, self.next_watch)

    def check(self, now: float) -> list[Cut]:
        """Read the connections due (all of them every interval; those just accepted, and
        those past a quarter of the bound, every watch interval) and cut those past the
        bound."""
        cut: list[Cut] = []
        found = list(self.found)
        self.found.clear()
        for fd in found:
            self._discover(fd, now)
        if now >= self.next_check:
            for fd in self.credits.keys() - self.connections.keys():  # (no event seen)
                self._discover(fd, now)
            due = list(self.connections)
            self.next_check = now + max(INTERVAL, len(due) * PROBE_SECONDS / CHECK_SHARE)
        else:
            due = [fd for fd, c in self.connections.items()
                   if c.held > self.limit // 4 or fd in found]
        watched = False
        for fd in due:
            connection = self.connections[fd]
            held = self._held(fd, connection, now)
            if held is None:
                continue
            if held > self.limit:
                if self.cut(fd, connection.inode):
                    self.cuts += 1
                    cut.append(Cut(connection.peer, held))
                del self.connections[fd]
            elif held > self.limit // 4:
                watched = True
        self.next_watch = now + WATCH_INTERVAL if watched else float("inf")
        return cut

    def _discover(self, fd: int, now: float) -> None:
        probed = self.probe(fd)
        if probed is None:
            self.credits.pop(fd, None)
            return
        reading, peer = probed
        known = self.connections.get(fd)
        if known is None or known.inode != reading.inode:
            self.connections[fd] = _Connection(reading.inode, peer, now)

    def _held(self, fd: int, connection: _Connection, now: float) -> int | None:
        """What ``connection`` holds now; None when its descriptor is gone or another's."""
        probed = self.probe(fd)
        if probed is None or probed[0].inode != connection.inode:
            del self.connections[fd]
            if probed is not None:  # (libzmq reused it: a new connection, found again)
                self._discover(fd, now)
            return None
        connection.credited += self.credits.pop(fd, 0) + int(
            IDLE_CREDIT * (now - connection.seen))
        connection.seen = now
        balance = probed[0].taken - connection.credited
        connection.lowest = min(connection.lowest, balance)
        connection.held = balance - connection.lowest
        return connection.held


class Intake:
    """The bound on what the connections of ``sock`` (a bound ROUTER) hold undelivered: its
    ``IntakeLedger``, and the reading and cutting of its descriptors. The owner feeds it the
    events of a monitor with ``MONITORED`` (``on_event``), every message it receives
    (``took``), and calls ``check`` once ``due``."""

    def __init__(self, sock: zmq.Socket, limit: int) -> None:
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._port = int(endpoint.rsplit(":", 1)[1]) if endpoint.startswith("tcp://") else -1
        self.ledger = IntakeLedger(limit, self._probe, self._cut)
        self.took = self.ledger.took
        self.cut_sender = self.ledger.cut_sender
        self.on_event = self.ledger.on_event
        self.due = self.ledger.due
        self.check = self.ledger.check

    def _probe(self, fd: int) -> tuple[Reading, str] | None:
        """Descriptor ``fd`` read, and its peer's address; None unless it is a TCP connection
        accepted by this socket (its local port)."""
        if self._port < 0:
            return None
        try:
            inode = os.fstat(fd).st_ino
            connection = socket.socket(fileno=fd)  # (its family, whatever it is)
        except OSError:
            return None
        try:
            if connection.getsockname()[1] != self._port:
                return None
            peer = connection.getpeername()
            info = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
            unread = _UNREAD.unpack(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)))[0]
        except OSError:
            return None
        finally:
            connection.detach()  # (libzmq's, not ours to close)
        if len(info) < _TCP_INFO_BYTES:  # (a kernel before 4.1 does not count)
            return None
        taken = _BYTES_RECEIVED.unpack_from(info, 128)[0] - unread
        return Reading(inode, taken), f"{peer[0]}:{peer[1]}"

    def _cut(self, fd: int, inode: int) -> bool:
        """Close connection ``fd`` (if it is still the socket of ``inode``) under libzmq:
        both directions shut down, so it reads the end of the connection and drops it,
        freeing what it held."""
        try:
            if os.fstat(fd).st_ino != inode:
                return False
            connection = socket.socket(fileno=fd)  # (its family, whatever it is)
        except OSError:
            return False
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        finally:
            connection.detach()
        return True
