"""The worker process, its I/O: a control thread that talks to the broker, one thread per device.

Rule: the control thread never computes and never carries a session's traffic. It owns the
worker's DEALER to the broker and performs what the sans-I/O control machine
(``workers.control``: registration, heartbeats, noticing a lost broker and registering
again) asks for. Each device thread owns its device's own DEALER to the broker, its "lane"
(a routing identity that REGISTER lists): it feeds what arrives there to its sans-I/O
``Lane`` (``workers.lane``, around the device's ``Executor``), one message of each session in
turn, and answers on it, so a read crosses no thread inside the worker, and a long op never
delays a heartbeat. The control thread speaks to each device thread over an inproc PAIR:
stop, reset (the broker that knew the sessions is gone), attach (after REGISTERED, the lane
says HEARTBEAT so the broker can route to it), and tensors moving between two sessions of
this worker, which go device to device in memory instead of through the broker. The control
thread never waits for a device: what a full pair cannot take waits in a bounded queue, and
a worker told to stop while a device computes a long op ends a few seconds later
(``_STOP_WAIT``), without waiting for the op.

A large tensor moved to a session of another worker goes over a direct link when the broker
grants one (``workers.direct_links``, ``workers.direct_links_io``): the device thread hands its
TRANSFER to the control thread, which asks the broker, dials the receiver's bulk endpoint, and
sends it there (or by the broker, when no link comes in time); the bytes are handed on, never
copied or read, and likewise those arriving at this worker's own endpoint.

Every link authenticates in the ZeroMQ handshake (the worker token as the PLAIN password,
or with CURVE the worker's key). The control DEALER's socket monitor reports what ZeroMQ
keeps silent: a token or CURVE key the broker refuses, or encryption on at one end only,
stops the worker (``RegistrationRefused``) as a refused REGISTER does. Where the event alone
does not say, the control machine asks for a probe of the broker's address, which this loop
makes.

The control thread also owns the link's *beacon* (``workers.control``), a DEALER that carries
nothing but libzmq's ZMTP heartbeats (sent and answered by libzmq's I/O thread, without the
GIL, so a device thread holding the GIL never silences the link): its monitor reports the
link's end, a broker that ended, stopped or was cut off, and what the broker sends it to
find out whether it is still there is read and dropped.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable

import zmq

from fabric.core import protocol
from fabric.core.errors import FabricError
from fabric.core.flow import DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, Outbox
from fabric.core.protocol import DeviceReport, Kind, WorkerReport, report_body
from fabric.core.security import CurveClient, announced_mechanism, present_token
from fabric.core.sockets import POLLIN, message_check, recv_frames, recv_monitor_event, try_send
from fabric.core.version import __version__

from . import shared_memory
from .backends import device_class
from .control import (Action, Attach, Connect, Control, Link, Probe, RegistrationRefused, Send,
                      zmtp_heartbeats)
from .direct_links import LINK_THRESHOLD, Fallback
from .direct_links_io import BulkLinks, reachable_host
from .executor import Executor
from .lane import DEVICE_KINDS, Lane, jumps_the_queue, message_body
from .memory import MemoryBudget

__all__ = ["RegistrationRefused", "Worker", "serve"]

log = logging.getLogger("fabric.worker")

# Commands on the inproc pairs, control thread to device thread (a read that came on a direct
# link, with the link's routing id, and the reply to it the other way); anything else there
# is a fabric message (a TRANSFER between two sessions of this worker).
_STOP, _RESET, _ATTACH = b"stop", b"reset", b"attach"
_LINK_READ, _LINK_REPLY = b"link-read", b"link-reply"
_STOP_WAIT = 5.0  # seconds a stopping worker waits, in all, for its device threads to end
_READ_AHEAD_BYTES = 64 << 20  # a device reads its lane this far ahead of running messages
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _dealer(worker: "Worker", identity: bytes, heartbeats: bool = False) -> zmq.Socket:
    """A DEALER to the broker's port for workers, not yet connected: it authenticates in the ZeroMQ
    handshake with the worker token (or with CURVE, the worker's key). With ``heartbeats``
    (the beacon's), libzmq keeps the link's liveness (``control.zmtp_heartbeats``)."""
    sock = worker.context.socket(zmq.DEALER)
    for option, value in ((zmq.LINGER, 0), (zmq.ROUTING_ID, identity), (zmq.SNDHWM, worker.hwm),
                          (zmq.RCVHWM, worker.hwm), (zmq.MAXMSGSIZE, worker.max_message_bytes)):
        sock.setsockopt(option, value)
    if heartbeats:
        for option, value in zmtp_heartbeats(worker.heartbeat, worker.liveness).items():
            sock.setsockopt(option, value)
    if worker.curve is not None:
        worker.curve.apply(sock)
    else:
        present_token(sock, "worker", worker.token)
    return sock


def _pair(context: zmq.Context, hwm: int) -> zmq.Socket:
    """One end of a control thread's link to a device thread (inproc adds both ends'
    limits, so both are bounded)."""
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


class _DeviceThread:
    """One device: its lane's socket to the broker, its ``Lane``, its pair to the control
    thread."""

    def __init__(self, worker: "Worker", index: int, executor: Executor) -> None:
        self.index = index
        self.lane = Lane(index, executor, worker.max_message_bytes, worker.session_device)
        self.pair_address = f"inproc://device-{index}"
        self._worker = worker
        self._lane_socket: zmq.Socket | None = None  # made at the first RESET
        # Whether a message waits on the lane (a non-empty list); none can before the
        # first RESET makes the lane.
        self._lane_waits: Callable[[], list[Any]] = list
        self._pair: zmq.Socket | None = None
        # What the loop polls (the pair, and the lane once there is one), for zmq.zmq_poll
        # itself: a Poller adds a Python call per wait.
        self._poll_items: list[tuple[zmq.Socket, int]] = []
        # Messages read from the lane and not yet run, by session (in the order sessions
        # came). The broker funnels every session of the device into the lane; running one
        # message of each session in turn keeps a session's long queue of batches from
        # holding up another session's read. Read ahead at most hwm messages and
        # _READ_AHEAD_BYTES (the Outbox's own bounds, per session, do not come into play).
        self._waiting = Outbox(worker.hwm, _READ_AHEAD_BYTES)

    def report(self) -> DeviceReport:
        """This device's figures, read from the control thread (``workers.tally``)."""
        executor = self.lane.executor
        return executor.tally.report(executor.allowance.held, self._waiting.messages)

    def run(self) -> None:
        worker = self._worker
        self._pair = _pair(worker.context, worker.hwm)
        self._pair.connect(self.pair_address)
        self._poll_items = [(self._pair, POLLIN)]
        # numpy's warnings of this device's ops go to their sessions, not to stderr; the
        # device's own state (where its module places new arrays) holds for its thread
        executor = self.lane.executor
        with executor.floating_point_errors(), executor.device.on_thread():
            self._serve()

    def _serve(self) -> None:
        waiting = self._waiting
        try:
            while True:
                # (Messages waiting: only a look at the sockets between two turns.)
                for sock, _ in zmq.zmq_poll(self._poll_items, 0 if waiting.messages else -1):
                    if sock is self._lane_socket:
                        self._read_lane()
                    elif sock is self._pair:
                        if not self._from_control(recv_frames(sock)):  # its STOP ends this
                            return
                    # (else the old lane, which a RESET earlier in this same poll closed)
                if waiting.messages:
                    self._take_turns()
        finally:
            self._pair.close(linger=0)
            self._close_lane()

    def _close_lane(self) -> None:
        if self._lane_socket is not None:
            del self._poll_items[1:]  # (the pair stays)
            self._lane_socket.close(linger=0)

    def _from_control(self, frames: list[zmq.Frame]) -> bool:
        """Obey a command from the control thread; False on STOP."""
        command = frames[0].bytes
        if command == _STOP:
            return False
        if command == _RESET:  # a new connection to the broker, under a new identity
            self.lane.reset()
            self._waiting.clear()  # (the old connection's)
            worker = self._worker
            self._close_lane()
            self._lane_socket = _dealer(worker, frames[1].bytes)
            self._lane_socket.connect(worker.broker)
            self._lane_waits = message_check(self._lane_socket)
            self._poll_items.append((self._lane_socket, POLLIN))
        elif command == _ATTACH:
            self._send(protocol.encode(self.lane.attach(int(frames[1].bytes))))
        elif command == _LINK_READ:  # its reply goes back to the link it came by
            for reply in self.lane.handle(frames[2:]):
                if not try_send(self._pair, [_LINK_REPLY, frames[1], *self.lane.frames(reply)]):
                    log.warning("device %d: a read that came on a direct link is not "
                                "answered (the worker's control thread takes nothing)",
                                self.index)
        else:  # a tensor moved from another device of this worker
            self._handle(frames)
        return True

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
            if (waiting.messages >= self._worker.hwm or waiting.bytes >= _READ_AHEAD_BYTES
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
        worker = self._worker
        deadline = time.monotonic() + worker.heartbeat * worker.liveness
        while time.monotonic() < deadline:
            if self._lane_socket.poll(100, zmq.POLLOUT) and try_send(self._lane_socket, frames):
                return
        log.warning("device %d: the broker took nothing for %.1f s; a %s message is dropped",
                    self.index, worker.heartbeat * worker.liveness,
                    protocol.decode_header(frames[0]).kind.name)


class Worker:
    """A worker hosting ``devices`` devices of one backend for the broker at ``broker``."""

    def __init__(self, broker: str, *, token: str, backend: str = "numpy", devices: int = 1,
                 name: str, heartbeat: float = 1.0, liveness: int = 3,
                 memory_limit: int | None = None, memory_budget: int | None = None,
                 curve: CurveClient | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 hwm: int = DEFAULT_HWM, give_up_after: float | None = None,
                 bulk_host: str | None = "auto") -> None:
        cls = device_class(backend)  # refuses capture/remote before anything starts
        self.broker = broker
        self.curve = curve  # CURVE keys: the links to the broker are encrypted
        self.token = token  # shown in every link's ZeroMQ handshake (without CURVE)
        self.backend = backend
        self.name = name
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_message_bytes = max_message_bytes  # MAXMSGSIZE of the DEALERs
        self.hwm = hwm  # SNDHWM and RCVHWM of every socket, and of each parked queue
        self.context = zmq.Context()
        self.devices = [cls(i) for i in range(devices)]
        # Direct links (``workers.direct_links``) on the address that reaches the broker, or
        # another the worker is reached at; None: every tensor moved to another worker takes the
        # broker.
        host = reachable_host(broker) if bulk_host == "auto" else bulk_host
        self.links = None if host is None else BulkLinks(
            self.context, host, curve, max_message_bytes, self._deliver, self._read_over_link)
        self.control = Control(
            {"token": token, "name": name, "backend": backend,
             "devices": [d.settings() for d in self.devices],
             "max_message_bytes": max_message_bytes, "fabric_version": __version__,
             "host": socket.gethostname(),
             **({"bulk": self.links.advertised()} if self.links is not None else {})},
            broker=broker, encrypted=curve is not None, heartbeat=heartbeat, liveness=liveness,
            give_up_after=give_up_after, report=self.report)
        self._budget = MemoryBudget(memory_budget, devices)  # one for all the devices
        self._executors = [Executor(device, memory_limit, self._budget)
                           for device in self.devices]
        self._pairs: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        self._runners: list[_DeviceThread] = []
        for i, executor in enumerate(self._executors):
            runner = _DeviceThread(self, i, executor)
            self._runners.append(runner)
            pair = _pair(self.context, hwm)
            pair.bind(runner.pair_address)
            thread = threading.Thread(target=runner.run, name=f"device-{i}", daemon=True)
            thread.start()
            self._pairs.append(pair)
            self._threads.append(thread)
        self._running = True
        # Commands and tensors moving in memory, for device threads whose pair is full (see
        # _to_device and _retry).
        self._to_devices = Outbox(hwm, max_message_bytes)  # by device index
        self._reading_devices = True
        self.dealer: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self.beacon: zmq.Socket | None = None  # the link's liveness (``workers.control``)
        self._beacon_monitor: zmq.Socket | None = None
        self.abandoned: list[int] = []  # devices still computing when close() gave up

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    def session_device(self, session: int) -> int | None:
        """The device of this worker that holds ``session``, if one does. Each device's
        executor alone owns its sessions; a look from another thread at whether one holds a
        session is a single dict lookup, atomic under the GIL."""
        for index, executor in enumerate(self._executors):
            if session in executor.sessions:
                return index
        return None

    def goes_direct(self, reply: protocol.Message) -> bool:
        """Whether ``reply`` (a device's, for another worker) asks for a direct link."""
        return (self.links is not None and reply.kind == Kind.TRANSFER
                and sum(memoryview(b).nbytes for b in reply.buffers) >= LINK_THRESHOLD)

    def report(self) -> dict[str, Any]:
        """What the control thread's HEARTBEAT says of the devices: the broker's metrics."""
        return report_body(WorkerReport(
            self._budget.limit, tuple(runner.report() for runner in self._runners),
            0 if self.links is None else self.links.admissions.refused))

    # -- what the control machine asks for ------------------------------------------------

    def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if type(action) is Send:
                self._send(action.message)
            elif type(action) is Attach:
                for device in range(len(self.devices)):  # each lane says HEARTBEAT, so
                    self._to_device(device, [_ATTACH, b"%d" % action.max_message_bytes])
            elif type(action) is Connect:
                self._connect(action)
            elif type(action) is Link and self.links is not None:
                self._fall_back(self.links.from_broker(action.message))
            elif type(action) is Probe:  # (blocks for at most half a second)
                mechanism = announced_mechanism(self.broker)
                self._perform(self.control.on_probe(action.event, action.value, mechanism))

    def _connect(self, connect: Connect) -> None:
        self._close_dealer()
        self._to_devices.clear()  # (for the sessions of the old connection)
        for device, lane in enumerate(connect.lanes):
            self._to_device(device, [_RESET, lane])
        self._set_reading_devices(True)
        self.dealer = _dealer(self, connect.identity)
        # A refused key or mismatched encryption is only ever a monitor event.
        self._monitor = self.dealer.get_monitor_socket(_HANDSHAKE_FAILED)
        self.dealer.connect(self.broker)
        # The link's end (the broker's, or libzmq's after its heartbeats went unanswered) is
        # the beacon's monitor's event.
        self.beacon = _dealer(self, connect.beacon, heartbeats=True)
        self._beacon_monitor = self.beacon.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.beacon.connect(self.broker)
        self._poller = zmq.Poller()
        for sock in (self.dealer, self._monitor, self.beacon, self._beacon_monitor,
                     *self._pairs):
            self._poller.register(sock, zmq.POLLIN)
        if self.links is not None:
            self.links.watch(self._poller)

    def _close_dealer(self) -> None:
        if self.dealer is None:
            return
        for sock, monitor in ((self.dealer, self._monitor), (self.beacon, self._beacon_monitor)):
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
        self.dealer = self._monitor = self.beacon = self._beacon_monitor = None

    def _send(self, message: protocol.Message) -> None:
        # Only registration and heartbeats use this socket: when the broker takes nothing,
        # a heartbeat would not help, and it is sent again a heartbeat later.
        if not try_send(self.dealer, protocol.encode(message)):
            log.warning("the broker takes nothing: a %s was not sent", message.kind.name)

    # -- commands, and tensors moving between devices of this worker ----------------------
    # A device thread hands the control thread a TRANSFER for a session on another device
    # of this worker (or sends it by the broker when the pair is full). The control thread
    # never blocks on a device's pair: what a full pair cannot take waits, in order, in a
    # bounded Outbox, and while one is full the device threads are not read.

    def _read_over_link(self, routing: bytes, frames: list[zmq.Frame]) -> None:
        """A client's read that came on a direct link goes to its session's device."""
        device = self.session_device(protocol.decode_header(frames[0]).session)
        if device is not None:
            self._to_device(device, [_LINK_READ, routing, *frames])

    def _transfer(self, frames: list[zmq.Frame]) -> None:
        if frames[0].bytes == _LINK_REPLY:  # (a device's answer to a read on a link)
            self.links.reply(frames[1].bytes, frames[2:])
            return
        # A device thread's own TRANSFER: for a session of this worker, or (large, for
        # another worker) over a direct link
        device = self.session_device(protocol.decode_header(frames[0]).session)
        if device is not None:
            self._to_device(device, frames)
        elif self.links is not None:
            self._send(self.links.send(frames, sum(len(f) for f in frames[1:])))
        # (else its session closed meanwhile; the broker would drop it too)

    def _deliver(self, frames: list[zmq.Frame]) -> None:
        """A TRANSFER for a session of this worker (from one of its devices, or over a direct
        link) goes to that session's device."""
        device = self.session_device(protocol.decode_header(frames[0]).session)
        if device is not None:  # (else it closed meanwhile; the broker would drop it too)
            self._to_device(device, frames)

    def _fall_back(self, fallbacks: list[Fallback]) -> None:
        """TRANSFERs that get no direct link go through the broker after all."""
        for fallback in fallbacks:
            if not try_send(self.dealer, fallback.frames):
                log.warning("the broker takes nothing: a tensor moved to another worker is "
                            "dropped")

    def _to_device(self, device: int, frames: list[Any]) -> None:
        if device in self._to_devices or not try_send(self._pairs[device], frames):
            if self._to_devices.park(device, frames, time.monotonic()):
                self._set_reading_devices(False)

    def _set_reading_devices(self, reading: bool) -> None:
        if reading != self._reading_devices and self.dealer is not None:
            for pair in self._pairs:
                self._poller.modify(pair, zmq.POLLIN if reading else 0)
        self._reading_devices = reading

    def _retry(self) -> None:
        """Send parked transfers, in order, as far as the pairs take them; read the device
        threads again once every queue drained to half."""
        for device in self._to_devices.keys():
            pair = self._pairs[device]
            self._to_devices.flush(device, lambda f, pair=pair: try_send(pair, f))
        if not self._to_devices.full_since:
            self._set_reading_devices(True)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until ``stop()``; reconnect and re-register whenever the broker is lost."""
        control = self.control
        wait_ms = control.tick_every * 1000
        try:
            self._perform(control.start(time.monotonic()))
            while self._running:
                wait = 5 if self._to_devices else wait_ms
                if self.links is not None:  # (its connections are checked on time)
                    wait = min(wait, self.links.wait_ms(time.monotonic()))
                for sock, _ in self._poller.poll(wait):
                    if sock is self.dealer:
                        self._perform(control.on_message(recv_frames(self.dealer),
                                                         time.monotonic()))
                    elif self.links is not None and self.links.owns(sock):
                        self.links.on_ready(sock)
                    elif sock is self._monitor:
                        event = recv_monitor_event(self._monitor)
                        self._perform(control.on_handshake_failed(event["event"],
                                                                  event["value"]))
                    elif sock is self.beacon:  # the broker asking whether it is there
                        self._drop_beacon_messages()
                    elif sock is self._beacon_monitor:
                        event = recv_monitor_event(self._beacon_monitor)
                        if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                            self._perform(control.on_beacon_up(time.monotonic()))
                            continue
                        self._perform(control.on_disconnected(time.monotonic()))
                        break  # (what this poll saw may be of sockets closed since)
                    else:
                        self._transfer(recv_frames(sock))
                if self._to_devices:
                    self._retry()
                if self.links is not None:
                    self._fall_back(self.links.tick())
                self._perform(control.tick(time.monotonic()))
        finally:
            self.close()

    def _drop_beacon_messages(self) -> None:
        """Read and drop what the broker sent the beacon (a bounded batch)."""
        for _ in range(100):
            try:
                self.beacon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return

    def close(self) -> None:
        """Stop the device threads and close every socket. A device thread still busy with
        an op after ``_STOP_WAIT`` seconds is left to end with the process."""
        for pair in self._pairs:
            try_send(pair, [_STOP])  # (a full pair: its thread is busy, and is left behind)
        deadline = time.monotonic() + _STOP_WAIT
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.abandoned = [i for i, thread in enumerate(self._threads) if thread.is_alive()]
        for pair in self._pairs:
            pair.close(linger=0)
        self._close_dealer()
        if self.links is not None:
            self.links.close()
        shared_memory.COPIES.close()
        if self.abandoned:  # terminating the context would wait for their sockets (their ops)
            log.warning("device(s) %s still computing after %g s: stopping without them",
                        ", ".join(map(str, self.abandoned)), _STOP_WAIT)
            return
        self.context.term()


def serve(broker: str, **options: Any) -> None:
    """Run a worker in this process until SIGINT or SIGTERM."""
    worker = Worker(broker, **options)
    signal.signal(signal.SIGINT, worker.stop)
    signal.signal(signal.SIGTERM, worker.stop)
    log.info("worker %s: %d %s device(s), broker %s", worker.name, len(worker.devices),
             worker.backend, broker)
    worker.run()
    if worker.abandoned:
        # The interpreter's exit would wait for their sockets forever (a daemon thread stops
        # at its next Python step, holding them open): end the process here.
        logging.shutdown()
        os._exit(0)
