"""The worker process: a control thread that talks to the broker, one thread per device.

Rule: the control thread never computes and never carries a session's traffic. It owns the
worker's DEALER to the broker: registration, heartbeats, noticing a lost broker and
registering again. Each device thread owns its device's own DEALER to the broker, its
"lane" (a routing identity that REGISTER lists): it runs ``Executor`` on what arrives there,
one message of each session in turn, and answers on it, so a read crosses no thread inside
the worker, and a long op never delays a heartbeat. The control thread speaks to each device
thread over an inproc PAIR: stop, reset (the broker that knew the sessions is gone), attach
(after REGISTERED, the lane says HEARTBEAT so the broker can route to it), and tensors moving
between two sessions of this worker, which go device to device in memory instead of through
the broker. The control thread never waits for a device: what a full pair cannot take waits
in a bounded queue, and a worker told to stop while a device computes a long op ends a few
seconds later (``_STOP_WAIT``), without waiting for the op.

The control DEALER's socket monitor reports what ZeroMQ keeps silent: a CURVE key the
broker refuses, or encryption on at one end only, stops the worker
(``RegistrationRefused``) as a refused token does.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable

import zmq

from fabric import protocol
from fabric.errors import (
    AuthenticationError,
    FabricError,
    MessageTooLarge,
    RemoteError,
    VersionMismatch,
    error_from_wire,
)
from fabric.flow import DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, Outbox, largest_frame, size_text
from fabric.protocol import Kind, Message
from fabric.security import CurveClient, handshake_error
from fabric.sockets import POLLIN, message_check, recv_frames, recv_monitor_event, try_send

from .backends import device_class
from .executor import Executor

log = logging.getLogger("fabric.worker")

# Commands on the inproc pairs, control thread to device thread; anything else there is a
# fabric message (a TRANSFER between two sessions of this worker).
_STOP, _RESET, _ATTACH = b"stop", b"reset", b"attach"
_STOP_WAIT = 5.0  # seconds a stopping worker waits, in all, for its device threads to end
_READ_AHEAD_BYTES = 64 << 20  # a device reads its lane this far ahead of running messages
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_DEVICE_KINDS = frozenset({Kind.OPEN, Kind.CLOSE, Kind.SUBMIT, Kind.REQUEST, Kind.TRANSFER})
# What a device thread looks at more closely, tested as sets on every message: on Python
# 3.11 each ``Kind.X`` goes through the enum class's __getattr__ hook, five times the cost
# of a plain attribute.
_SESSION_LIFE = frozenset({Kind.OPEN, Kind.CLOSE})  # noted by the thread itself
_NOTED_REPLIES = frozenset({Kind.OPENED, Kind.TRANSFER})  # a new session; a tensor moving
# What may carry a frame too big, and whether the way ahead ends at the session's client
# (whose limit may be lower than the broker's).
_SIZED_REPLIES = {Kind.REPLY: True, Kind.TRANSFER: False}


def _routing_identity() -> bytes:
    """A fresh random routing identity (ZeroMQ reserves those that start with a zero byte)."""
    return b"F" + os.urandom(15)


def _dealer(context: zmq.Context, identity: bytes, hwm: int, max_message_bytes: int,
            curve: CurveClient | None) -> zmq.Socket:
    """A DEALER to the broker's backend, not yet connected."""
    sock = context.socket(zmq.DEALER)
    for option, value in ((zmq.LINGER, 0), (zmq.ROUTING_ID, identity), (zmq.SNDHWM, hwm),
                          (zmq.RCVHWM, hwm), (zmq.MAXMSGSIZE, max_message_bytes)):
        sock.setsockopt(option, value)
    if curve is not None:
        curve.apply(sock)
    return sock


def _body(header: protocol.Header, frames: list[zmq.Frame]) -> dict[str, Any]:
    """A message's msgpack body, or an empty map when it has none or a malformed one."""
    try:
        return protocol.decode(frames, header).body
    except FabricError:
        return {}


def _pair(context: zmq.Context, hwm: int) -> zmq.Socket:
    """One end of a control thread's link to a device thread (inproc adds both ends'
    limits, so both are bounded)."""
    sock = context.socket(zmq.PAIR)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


class RegistrationRefused(Exception):
    """The broker refused this worker for a reason retrying cannot fix."""


class _DeviceThread:
    """One device: its lane to the broker, its executor, its pair to the control thread."""

    def __init__(self, worker: "Worker", index: int, executor: Executor) -> None:
        self.index = index
        self.executor = executor
        self.pair_address = f"inproc://device-{index}"
        self._worker = worker
        self._broker_limit = worker.max_message_bytes  # the largest frame the broker takes
        self._reply_limit: dict[int, int] = {}  # session -> largest frame its client takes
        self._lane: zmq.Socket | None = None  # made at the first RESET
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

    def run(self) -> None:
        worker = self._worker
        self._pair = _pair(worker.context, worker.hwm)
        self._pair.connect(self.pair_address)
        self._poll_items = [(self._pair, POLLIN)]
        waiting = self._waiting
        try:
            while True:
                # (Messages waiting: only a look at the sockets between two turns.)
                for sock, _ in zmq.zmq_poll(self._poll_items, 0 if waiting.messages else -1):
                    if sock is self._lane:
                        self._read_lane()
                        continue
                    if not self._from_control(recv_frames(sock)):  # its STOP ends this
                        return
                if waiting.messages:
                    self._take_turns()
        finally:
            self._pair.close(linger=0)
            self._close_lane()

    def _close_lane(self) -> None:
        if self._lane is not None:
            del self._poll_items[1:]  # (the pair stays)
            self._lane.close(linger=0)

    def _from_control(self, frames: list[zmq.Frame]) -> bool:
        """Obey a command from the control thread; False on STOP."""
        command = frames[0].bytes
        if command == _STOP:
            return False
        if command == _RESET:  # a new connection to the broker, under a new identity
            for session in self.executor.sessions:
                self._forget(session)
            self.executor.close_all()
            self._waiting.clear()  # (the old connection's)
            worker = self._worker
            self._close_lane()
            self._lane = _dealer(worker.context, frames[1].bytes, worker.hwm,
                                 worker.max_message_bytes, worker.curve)
            self._lane.connect(worker.broker)
            self._lane_waits = message_check(self._lane)
            self._poll_items.append((self._lane, POLLIN))
        elif command == _ATTACH:
            self._broker_limit = int(frames[1].bytes)
            self._send(protocol.encode(Message(Kind.HEARTBEAT)))
        else:  # a tensor moved from another device of this worker
            self._handle(frames)
        return True

    def _read_lane(self) -> None:
        """Read what the lane holds, as far as the bounds allow: a session's message waits
        its turn, one for the device itself (a heartbeat, an error) is dealt with now.

        When no message waits, the first one read runs at once, before the lane is read
        further: a lone read is answered without a detour through the queue (and the look
        at the lane that follows is no longer between it and its answer)."""
        lane, waiting = self._lane, self._waiting
        run_now = not waiting.messages
        while True:
            self._from_broker(recv_frames(lane), run_now)
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
        if header.kind in _DEVICE_KINDS:
            if run_now:
                self._handle(frames, header)
            else:
                self._waiting.park(header.session, frames, 0.0)  # (its turn comes; no clock)
        elif header.kind == Kind.HEARTBEAT:
            self._reconcile(header, frames)
        elif header.kind in (Kind.ERROR, Kind.REJECT):
            log.warning("the broker reported on device %d's lane: %s", self.index,
                        _body(header, frames).get("message"))

    def _note_open(self, message: Message) -> None:
        limit = message.body.get("max_message_bytes")  # (the executor refuses a bad OPEN)
        if type(limit) is int and limit > 0:
            self._reply_limit[message.session] = min(limit, self._broker_limit)

    def _forget(self, session: int) -> None:
        self._reply_limit.pop(session, None)
        if self._worker.session_device.get(session) == self.index:
            del self._worker.session_device[session]

    def _reconcile(self, header: protocol.Header, frames: list[zmq.Frame]) -> None:
        """Close every session the broker's heartbeat does not list: the broker forgot it
        (its CLOSE may have been lost), so nothing will ever close it otherwise."""
        listed = _body(header, frames).get("sessions")
        if not isinstance(listed, list):
            return
        known = set(listed)
        for session in [s for s in self.executor.sessions if s not in known]:
            log.info("session %#x is gone from the broker: closing it here", session)
            self._forget(session)
            self.executor.handle(Message(Kind.CLOSE, session))

    def _handle(self, frames: list[zmq.Frame], header: protocol.Header | None = None) -> None:
        """Run one message (``header``: its first frame's, if already read) and answer."""
        try:
            message = protocol.decode(frames, header)
            if message.kind in _SESSION_LIFE:
                if message.kind == Kind.OPEN:
                    self._note_open(message)
                else:
                    self._forget(message.session)
            replies = self.executor.handle(message)
        except Exception as exc:  # (the header was read when the message came: it decodes)
            if not isinstance(exc, FabricError):  # a bug, which must not end the device
                log.exception("device %d failed on a message", self.index)
                exc = RemoteError(f"Device {self.index} failed on this message "
                                  f"({type(exc).__name__}: {exc}); it goes on serving.")
            header = protocol.decode_header(frames[0])
            replies = [protocol.error_message(exc, session=header.session,
                                              request=header.request)]
        for reply in replies:
            if reply.kind in _NOTED_REPLIES:
                if reply.kind == Kind.OPENED:
                    self._worker.session_device[reply.session] = self.index
                elif reply.session in self._worker.session_device and \
                        try_send(self._pair, protocol.encode(reply)):
                    # Both sessions live on this worker: the tensor moved in memory (when
                    # the control thread's queue is full, it goes the long way, by the broker).
                    continue
            self._send(self._within_limits(reply))

    def _within_limits(self, reply: Message) -> list[Any]:
        """A reply's frames, or in place of a REPLY or TRANSFER bigger than the way ahead
        takes, the same message carrying ``MessageTooLarge`` (a frame too big would cost
        the connection)."""
        frames = protocol.encode(reply)
        to_client = _SIZED_REPLIES.get(reply.kind)
        if to_client is None or not reply.buffers:
            return frames
        limit = (self._reply_limit.get(reply.session, self._broker_limit) if to_client
                 else self._broker_limit)
        size = largest_frame(frames)
        if size <= limit:
            return frames
        if to_client:
            error = MessageTooLarge(
                f"The array read is {size_text(size)}, more than the {size_text(limit)} the "
                "way to the client takes in one message: read it in slices "
                "(t[:n].numpy()), or raise --max-message-bytes on the broker and workers "
                "and max_message_bytes= on the client.", size=size, limit=limit)
            return protocol.encode(protocol.reply_to(reply, {"error": error.to_wire()}))
        error = MessageTooLarge(
            f"The tensor moved with .to() is {size_text(size)}, more than the "
            f"{size_text(limit)} the broker takes in one message: move it in slices, or "
            "raise --max-message-bytes on the broker and workers.", size=size, limit=limit)
        return protocol.encode(Message(Kind.TRANSFER, reply.session, reply.request,
                                       {"id": reply.body.get("id"), "error": error.to_wire()}))

    def _send(self, frames: list[Any]) -> None:
        """Send on the lane; while the broker takes nothing, this device waits (and reads
        nothing: backpressure), but not longer than the broker's liveness window: past it
        the broker is gone, and so is what the message answered."""
        if try_send(self._lane, frames):
            return
        worker = self._worker
        deadline = time.monotonic() + worker.heartbeat * worker.liveness
        while time.monotonic() < deadline:
            if self._lane.poll(100, zmq.POLLOUT) and try_send(self._lane, frames):
                return
        log.warning("device %d: the broker took nothing for %.1f s; a %s message is dropped",
                    self.index, worker.heartbeat * worker.liveness,
                    protocol.decode_header(frames[0]).kind.name)


class Worker:
    """A worker hosting ``devices`` devices of one backend for the broker at ``broker``."""

    def __init__(self, broker: str, *, token: str, backend: str = "numpy", devices: int = 1,
                 name: str, heartbeat: float = 1.0, liveness: int = 3,
                 memory_limit: int | None = None, curve: CurveClient | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 hwm: int = DEFAULT_HWM) -> None:
        cls = device_class(backend)  # refuses capture/remote before anything starts
        self.broker = broker
        self.token = token
        self.curve = curve  # CURVE keys: the links to the broker are encrypted
        self.backend = backend
        self.name = name
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_message_bytes = max_message_bytes  # MAXMSGSIZE of the DEALERs
        self.hwm = hwm  # SNDHWM and RCVHWM of every socket, and of each parked queue
        self.context = zmq.Context()
        self.devices = [cls(i) for i in range(devices)]
        # Which device holds each open session: device threads write their own, and read
        # it to send a TRANSFER in memory when its destination session is on this worker.
        self.session_device: dict[int, int] = {}
        self._lanes: list[bytes] = []  # each device's lane identity, new at each _connect
        self._pairs: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        for i, device in enumerate(self.devices):
            runner = _DeviceThread(self, i, Executor(device, memory_limit))
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
        self._warned = False  # about a failed CURVE handshake, once per connection
        self.abandoned: list[int] = []  # devices still computing when close() gave up

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    # -- connection to the broker ----------------------------------------------------------

    def _connect(self) -> None:
        self._close_dealer()
        # Sessions die with the broker connection that knew them; every socket starts
        # afresh, under a new identity (the broker may not yet have dropped the old ones).
        self._lanes = [_routing_identity() for _ in self._pairs]
        self._to_devices.clear()  # (for the sessions of the old connection)
        for device, lane in enumerate(self._lanes):
            self._to_device(device, [_RESET, lane])
        self._set_reading_devices(True)
        self.dealer = _dealer(self.context, _routing_identity(), self.hwm,
                              self.max_message_bytes, self.curve)
        # A refused key or mismatched encryption is only ever a monitor event.
        self._monitor = self.dealer.get_monitor_socket(_HANDSHAKE_FAILED)
        self._warned = False
        self.dealer.connect(self.broker)
        self._poller = zmq.Poller()
        for sock in (self.dealer, self._monitor, *self._pairs):
            self._poller.register(sock, zmq.POLLIN)
        self._register()

    def _close_dealer(self) -> None:
        if self.dealer is None:
            return
        self.dealer.disable_monitor()
        self._monitor.close(linger=0)
        self.dealer.close(linger=0)
        self.dealer = self._monitor = None

    def _on_handshake_failed(self, event: dict[str, Any]) -> None:
        if self._warned:  # already explained; libzmq goes on retrying by itself
            return
        error = handshake_error(event["event"], event["value"], self.broker,
                                encrypted=self.curve is not None)
        if error is None:
            return
        if (event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                or error.details.get("reason") == "mechanism_mismatch"):
            raise RegistrationRefused(error.message)  # retrying with these keys cannot help
        log.warning("%s", error.message)  # once per connection
        self._warned = True

    def _register(self) -> None:
        body = {"token": self.token, "name": self.name, "backend": self.backend,
                "devices": [d.settings() for d in self.devices],
                "lanes": self._lanes,
                "max_message_bytes": self.max_message_bytes}
        self._send(Message(Kind.REGISTER, body=body))

    def _send(self, message: Message) -> None:
        # Only registration and heartbeats use this socket: when the broker takes nothing,
        # a heartbeat would not help, and it is sent again a heartbeat later.
        if not try_send(self.dealer, protocol.encode(message)):
            log.warning("the broker takes nothing: a %s was not sent", message.kind.name)

    # -- commands, and tensors moving between devices of this worker ----------------------
    # A device thread hands the control thread a TRANSFER for a session on another device
    # of this worker (or sends it by the broker when the pair is full). The control thread
    # never blocks on a device's pair: what a full pair cannot take waits, in order, in a
    # bounded Outbox, and while one is full the device threads are not read.

    def _transfer(self, frames: list[zmq.Frame]) -> None:
        header = protocol.decode_header(frames[0])  # a device thread's own TRANSFER
        device = self.session_device.get(header.session)
        if device is None:
            return  # the destination closed meanwhile; the broker would drop it too
        self._to_device(device, frames)

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
        try:
            self._connect()
            last_heard = last_sent = time.monotonic()
            while self._running:
                for sock, _ in self._poller.poll(5 if self._to_devices else
                                                 min(100, self.heartbeat * 1000)):
                    if sock is self.dealer:
                        last_heard = time.monotonic()
                        self._from_broker(recv_frames(self.dealer))
                    elif sock is self._monitor:
                        self._on_handshake_failed(recv_monitor_event(self._monitor))
                    else:
                        self._transfer(recv_frames(sock))
                if self._to_devices:
                    self._retry()
                now = time.monotonic()
                if now - last_heard > self.heartbeat * self.liveness:
                    log.warning("broker silent for %.1f s; reconnecting", now - last_heard)
                    self._connect()
                    last_heard = now
                elif now - last_sent >= self.heartbeat:
                    self._send(Message(Kind.HEARTBEAT))
                    last_sent = now
        finally:
            self.close()

    def _from_broker(self, frames: list[zmq.Frame]) -> None:
        try:
            header = protocol.decode_header(frames[0])
        except FabricError as exc:
            log.warning("bad message from the broker: %s", exc)
            return
        if header.kind in (Kind.HEARTBEAT, Kind.PONG):
            return  # the lanes' heartbeats list each device's sessions
        if header.kind in (Kind.REGISTERED, Kind.REJECT, Kind.ERROR) and header.session == 0:
            self._control_from_broker(protocol.decode(frames, header))
            return
        log.warning("a %s message for session %#x came on the worker's own socket, not on "
                    "a device's lane: dropped", header.kind.name, header.session)

    def _control_from_broker(self, message: Message) -> None:
        if message.kind == Kind.REGISTERED:
            log.info("registered with %s", message.body["server"])
            limit = message.body.get("max_message_bytes")
            limit = limit if type(limit) is int and limit > 0 else self.max_message_bytes
            for device in range(len(self.devices)):  # each lane says HEARTBEAT, so the
                self._to_device(device, [_ATTACH, b"%d" % limit])  # broker can route to it
            return
        error = error_from_wire(message.body)
        if isinstance(error, (AuthenticationError, VersionMismatch)):
            raise RegistrationRefused(error.message)
        if error.details.get("reason") == "not_registered":
            log.warning("the broker does not know this worker (it restarted?): registering")
            self._register()
            return
        log.warning("the broker reported: %s", error.message)

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
