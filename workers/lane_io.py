"""A device thread, its I/O: one device's lane to the broker, and its pair to the control
thread (``workers.control_io``).

Rule: a device thread owns its device's own DEALER to the broker, its "lane" (a routing
identity that REGISTER lists), and feeds what arrives there to its sans-I/O ``Lane``
(``workers.lane``, around the device's ``Executor``), one message of each session in turn,
and answers on it: a read crosses no thread inside the worker, and a long op never delays a
heartbeat. The control thread speaks to it over an inproc PAIR: stop, reset (the broker that
knew the sessions is gone: a new lane under a new identity), attach (after REGISTERED, the
lane says HEARTBEAT so the broker can route to it), a read that came on a direct link, and
tensors moving between two sessions of this worker, which go device to device in memory
instead of through the broker. What a device thread hands the control thread goes back over
the same pair. The worker's options (``fabric.core.worker_options.WorkerOptions``) set every
socket's bounds and credentials (``dealer``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Protocol

import zmq

from fabric.core import protocol
from fabric.core.errors import FabricError
from fabric.core.flow import Outbox
from fabric.core.protocol import DeviceReport, Kind, SessionReport
from fabric.core.resume import HeldSession
from fabric.core.security import present_token
from fabric.core.sockets import POLLIN, message_check, recv_frames, try_send
from fabric.core.worker_options import WorkerOptions

from . import device_pool
from .control import zmtp_heartbeats
from .executor import Executor
from .heap import Heap
from .lane import DEVICE_KINDS, Lane, jumps_the_queue, message_body

log = logging.getLogger("fabric.worker")

# Commands on the inproc pairs, control thread to device thread (a read that came on a direct
# link, with the link's routing id, and the reply to it the other way); anything else there
# is a fabric message (a TRANSFER between two sessions of this worker).
STOP, RESET, ATTACH = b"stop", b"reset", b"attach"
DROP = b"drop"  # the sessions kept for a broker that takes over: their grace is over
KEEP = b"keep"  # (RESET's last frame: the sessions stay, for the broker that takes over)
LINK_READ, LINK_REPLY = b"link-read", b"link-reply"
_READ_AHEAD_BYTES = 64 << 20  # a device reads its lane this far ahead of running messages


def dealer(context: zmq.Context, options: WorkerOptions, identity: bytes,
           heartbeats: bool = False) -> zmq.Socket:
    """A DEALER to the broker's port for workers, not yet connected: it authenticates in the
    ZeroMQ handshake with the worker token (or with CURVE, the worker's key). With ``heartbeats``
    (the beacon's), libzmq keeps the link's liveness (``control.zmtp_heartbeats``)."""
    sock = context.socket(zmq.DEALER)
    for option, value in ((zmq.LINGER, 0), (zmq.ROUTING_ID, identity),
                          (zmq.SNDHWM, options.hwm), (zmq.RCVHWM, options.hwm),
                          (zmq.MAXMSGSIZE, options.max_message_bytes)):
        sock.setsockopt(option, value)
    if heartbeats:
        for option, value in zmtp_heartbeats(options.heartbeat, options.liveness).items():
            sock.setsockopt(option, value)
    if options.curve is not None:
        options.curve.apply(sock)
    else:
        present_token(sock, "worker", options.token)
    return sock


def pair_socket(context: zmq.Context, hwm: int) -> zmq.Socket:
    """One end of a control thread's link to a device thread (inproc adds both ends'
    limits, so both are bounded)."""
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


class LaneHost(Protocol):
    """What a device thread asks of its worker (``workers.control_io.Worker``)."""

    context: zmq.Context
    options: WorkerOptions
    heap: Heap | None  # (the process's: ``workers.heap``)

    def session_device(self, session: int) -> int | None:
        """The index of the device of this worker that serves ``session``, if one does."""

    def goes_direct(self, reply: protocol.Message) -> bool:
        """Whether ``reply`` (a TRANSFER) goes to its worker over a direct link."""


class DeviceThread:
    """One device: its lane's socket to the broker, its ``Lane``, its pair to the control
    thread (``run`` is the thread's body)."""

    def __init__(self, worker: LaneHost, index: int, executor: Executor) -> None:
        self.index = index
        options = worker.options
        self.lane = Lane(index, executor, options.max_message_bytes, worker.session_device)
        self.pair_address = f"inproc://device-{index}"
        self._worker = worker
        self._hwm = options.hwm
        self._broker_window = options.heartbeat * options.liveness  # (``_send``)
        self._lane_socket: zmq.Socket | None = None  # made at the first RESET
        # Whether a message waits on the lane (a non-empty list); none can before the
        # first RESET makes the lane.
        self._lane_waits: Callable[[], list[Any]] = list
        self._pair: zmq.Socket | None = None
        # What the loop polls (the pair, and the lane once there is one), for zmq.zmq_poll
        # itself: a Poller adds a Python call per wait.
        self._poll_items: list[tuple[zmq.Socket | int, int]] = []
        # Messages read from the lane and not yet run, by session (in the order sessions
        # came). The broker funnels every session of the device into the lane; running one
        # message of each session in turn keeps a session's long queue of batches from
        # holding up another session's read. Read ahead at most hwm messages and
        # _READ_AHEAD_BYTES (the Outbox's own bounds, per session, do not come into play).
        self._waiting = Outbox(self._hwm, _READ_AHEAD_BYTES)
        # Readable once the device's pool made a segment on its own thread, whose request
        # waits for its answer (``workers.device_pool``): the loop polls it with the sockets.
        self._made = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        executor.wake = lambda: os.eventfd_write(self._made, 1)

    def report(self) -> DeviceReport:
        """This device's figures, read from the control thread (``workers.tally``)."""
        executor = self.lane.executor
        return executor.tally.report(executor.allowance.held, self._waiting.messages,
                                     0 if executor.slots is None else executor.slots.held)

    def sessions(self) -> list[SessionReport]:
        """What this device holds and ran for each of its sessions, read from the control
        thread (the copy of the table is one C call, which the device thread cannot split)."""
        return [SessionReport(session_id, session.resident, session.ops)
                for session_id, session in list(self.lane.executor.sessions.items())]

    def held(self) -> list[HeldSession]:
        """The sessions this device keeps for the broker that takes over (``Lane.held``)."""
        return self.lane.held()

    def run(self) -> None:
        """Serve the lane and the pair until the control thread says STOP."""
        worker = self._worker
        self._pair = pair_socket(worker.context, self._hwm)
        self._pair.connect(self.pair_address)
        self._poll_items = [(self._pair, POLLIN), (self._made, POLLIN)]
        # numpy's warnings of this device's ops go to their sessions, not to stderr; the
        # device's own state (where its module places new arrays) holds for its thread
        executor = self.lane.executor
        device_pool.ready_for_start(executor)
        with executor.floating_point_errors(), executor.device.on_thread():
            self._serve()

    def _serve(self) -> None:
        waiting = self._waiting
        try:
            while True:
                # (Messages waiting: only a look at the sockets between two turns.)
                wait = 0 if waiting.messages else device_pool.idle_wait_ms(self.lane.executor)
                events = zmq.zmq_poll(self._poll_items, wait)
                if not events and wait > 0:  # (the device idled that long)
                    device_pool.idle(self.lane.executor)
                for sock, _ in events:
                    if sock is self._lane_socket:
                        self._read_lane()
                    elif sock is self._pair:
                        if not self._from_control(recv_frames(sock)):  # its STOP ends this
                            return
                    elif sock == self._made:
                        self._send_made()
                    # (else the old lane, which a RESET earlier in this same poll closed)
                if waiting.messages:
                    self._take_turns()
        finally:
            self._pair.close(linger=0)
            self._close_lane()
            executor = self.lane.executor
            if executor.slots is not None:  # (its maker ends first: it writes to _made)
                executor.slots.close()
            os.close(self._made)

    def _close_lane(self) -> None:
        if self._lane_socket is not None:
            del self._poll_items[2:]  # (the pair and the pool's wake-up stay)
            self._lane_socket.close(linger=0)

    def _from_control(self, frames: list[zmq.Frame]) -> bool:
        """Obey a command from the control thread; False on STOP."""
        command = frames[0].bytes
        if command == STOP:
            return False
        if command == RESET:  # a new connection to the broker, under a new identity
            if frames[-1].bytes != KEEP:  # (kept: their messages still run, in order)
                self.lane.reset()
                self._waiting.clear()  # (the old connection's)
            worker = self._worker
            self._close_lane()
            self._lane_socket = dealer(worker.context, worker.options, frames[1].bytes)
            self._lane_socket.connect(frames[2].bytes.decode())  # (the control's broker)
            self._lane_waits = message_check(self._lane_socket)
            self._poll_items.append((self._lane_socket, POLLIN))
        elif command == DROP:
            self.lane.reset()
            self._waiting.clear()
        elif command == ATTACH:
            self._send(protocol.encode(self.lane.attach(int(frames[1].bytes))))
        elif command == LINK_READ:  # its reply goes back to the link it came by
            for reply in self.lane.handle(frames[2:]):
                if not try_send(self._pair, [LINK_REPLY, frames[1], *self.lane.frames(reply)]):
                    log.warning("device %d: a read that came on a direct link is not "
                                "answered (the worker's control thread takes nothing)",
                                self.index)
        else:  # a tensor moved from another device of this worker
            self._handle(frames)
        return True

    def _send_made(self) -> None:
        """Send the answers to the slot requests whose segments were made."""
        try:
            os.eventfd_read(self._made)
        except BlockingIOError:  # (read by an earlier turn)
            pass
        for reply in self.lane.made():
            self._send(self.lane.frames(reply))

    def _read_lane(self) -> None:
        """Read what the lane holds, as far as the bounds allow: a session's message waits
        its turn, one for the device itself (a heartbeat, an error) is dealt with now.

        When no message waits, the first one read runs at once, before the lane is read
        further: a lone read is answered without a detour through the queue (and the look
        at the lane that follows is no longer between it and its answer)."""
        sock, waiting = self._lane_socket, self._waiting
        run_now = not waiting.messages
        while True:
            self._from_broker(recv_frames(sock), run_now)
            run_now = False
            if (waiting.messages >= self._hwm or waiting.bytes >= _READ_AHEAD_BYTES
                    or not self._lane_waits()):
                return

    def _take_turns(self) -> None:
        """Run the first waiting message of each session that has one."""
        for session in self._waiting.keys():
            self._handle(self._waiting.take(session))

    def _from_broker(self, frames: list[zmq.Frame], run_now: bool) -> None:
        try:
            header = protocol.decode_header(frames[0])
        except FabricError as exc:
            log.warning("bad message from the broker on device %d: %s", self.index, exc)
            return
        if header.kind in DEVICE_KINDS:
            if run_now or jumps_the_queue(header, frames):
                self._handle(frames, header)
            else:
                self._waiting.park(header.session, frames, 0.0)  # (its turn comes; no clock)
        elif header.kind == Kind.HEARTBEAT:
            self.lane.reconcile(header, frames)
            if self._worker.heap is not None:
                self._worker.heap.heartbeat(self.index, self.lane.executor.tally.op_seconds)
        elif header.kind in (Kind.ERROR, Kind.REJECT):
            log.warning("the broker reported on device %d's lane: %s", self.index,
                        message_body(header, frames).get("message"))

    def _handle(self, frames: list[zmq.Frame], header: protocol.Header | None = None) -> None:
        """Run one message (``header``: its first frame's, if already read) and answer."""
        lane = self.lane
        for reply in lane.handle(frames, header):
            if lane.stays_on_worker(reply) and try_send(self._pair, protocol.encode(reply)):
                # Both sessions live on this worker: the tensor moved in memory (when the
                # control thread's queue is full, it goes the long way, by the broker).
                continue
            frames = lane.frames(reply)
            if self._worker.goes_direct(reply) and try_send(self._pair, frames):
                continue  # a large tensor for another worker: over a direct link, if granted
            self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        """Send on the lane; while the broker takes nothing, this device waits (and reads
        nothing: backpressure), but not longer than the broker's liveness window: past it
        the broker is gone, and so is what the message answered."""
        if try_send(self._lane_socket, frames):
            return
        deadline = time.monotonic() + self._broker_window
        while time.monotonic() < deadline:
            if self._lane_socket.poll(100, zmq.POLLOUT) and try_send(self._lane_socket, frames):
                return
        log.warning("device %d: the broker took nothing for %.1f s; a %s message is dropped",
                    self.index, self._broker_window,
                    protocol.decode_header(frames[0]).kind.name)
