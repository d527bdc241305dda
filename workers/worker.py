"""The worker process: a socket thread that talks to the broker, one thread per device.

Rule: the socket thread never computes. It owns the DEALER to the broker, heartbeats,
notices a lost broker and re-registers, and hands each session's messages to the thread of
the device that serves the session over an inproc PAIR. Device threads run ``Executor``;
a long op there never delays a heartbeat. The DEALER's socket monitor reports what ZeroMQ
keeps silent: a CURVE key the broker refuses, or encryption on at one end only, stops the
worker (``RegistrationRefused``) as a refused token does.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from fabric import protocol
from fabric.errors import (
    AuthenticationError,
    FabricError,
    MessageTooLarge,
    VersionMismatch,
    error_from_wire,
)
from fabric.flow import DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, Outbox, largest_frame, size_text
from fabric.protocol import Kind, Message
from fabric.security import CurveClient, handshake_error

from .backends import device_class
from .executor import Executor

log = logging.getLogger("fabric.worker")

_STOP, _RESET = b"stop", b"reset"  # control frames on the inproc pairs
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _try_send(sock: zmq.Socket, frames: list[Any]) -> bool:
    """Send without blocking; False when the socket's queue is full."""
    try:
        sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


class RegistrationRefused(Exception):
    """The broker refused this worker for a reason retrying cannot fix."""


def _device_thread(context: zmq.Context, address: str, executor: Executor,
                   hwm: int = DEFAULT_HWM) -> None:
    pair = context.socket(zmq.PAIR)
    pair.setsockopt(zmq.SNDHWM, hwm)  # inproc adds both ends' limits: both are bounded
    pair.setsockopt(zmq.RCVHWM, hwm)
    pair.connect(address)
    try:
        while True:
            frames = pair.recv_multipart(copy=False)
            if len(frames) == 1:
                if frames[0].bytes == _STOP:
                    return
                executor.close_all()  # _RESET
                continue
            try:
                replies = executor.handle(protocol.decode(frames))
            except FabricError as exc:
                header = protocol.decode_header(frames[0])
                replies = [protocol.error_message(exc, session=header.session,
                                                  request=header.request)]
            for reply in replies:
                pair.send_multipart(protocol.encode(reply), copy=False)
    finally:
        pair.close(linger=0)


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
        self.curve = curve  # CURVE keys: the link to the broker is encrypted
        self.backend = backend
        self.name = name
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_message_bytes = max_message_bytes  # MAXMSGSIZE of the DEALER
        self.hwm = hwm  # SNDHWM and RCVHWM of every socket, and of each parked queue
        self.context = zmq.Context()
        self.devices = [cls(i) for i in range(devices)]
        self._pairs: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        for i, device in enumerate(self.devices):
            address = f"inproc://device-{i}"
            pair = self.context.socket(zmq.PAIR)
            pair.setsockopt(zmq.SNDHWM, hwm)
            pair.setsockopt(zmq.RCVHWM, hwm)
            pair.bind(address)
            thread = threading.Thread(target=_device_thread, name=f"device-{i}", daemon=True,
                                      args=(self.context, address,
                                            Executor(device, memory_limit), hwm))
            thread.start()
            self._pairs.append(pair)
            self._threads.append(thread)
        self._session_device: dict[int, int] = {}
        self._running = True
        # Flow control (see ``_to_device``): messages a full socket could not take yet.
        self._to_devices = Outbox(hwm, max_message_bytes)  # by device index
        self._to_broker = Outbox(hwm, max_message_bytes)  # one key: None
        self._reading_broker = self._reading_devices = True
        self._broker_limit = max_message_bytes  # the largest frame the broker takes
        self._reply_limit: dict[int, int] = {}  # session -> largest frame its client takes
        self.dealer: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._warned = False  # about a failed CURVE handshake, once per connection

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    # -- connection to the broker ----------------------------------------------------------

    def _connect(self) -> None:
        self._close_dealer()
        for pair in self._pairs:  # sessions die with the broker connection that knew them
            pair.send(_RESET)
        self._session_device.clear()
        self._flow_reset()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        for option, value in ((zmq.SNDHWM, self.hwm), (zmq.RCVHWM, self.hwm),
                              (zmq.MAXMSGSIZE, self.max_message_bytes)):
            self.dealer.setsockopt(option, value)
        if self.curve is not None:
            self.curve.apply(self.dealer)
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
                "max_message_bytes": self.max_message_bytes}
        self._send(Message(Kind.REGISTER, body=body))

    def _send(self, message: Message) -> None:
        self._to_broker_send(protocol.encode(message))

    # -- flow control -------------------------------------------------------------------------
    # No send here blocks the socket thread (heartbeats go on) and nothing is dropped: a
    # message that a full socket cannot take waits in a bounded Outbox; while a device's
    # queue is full the broker's messages are not read (they wait in the DEALER, then in the
    # broker), and while the queue to the broker is full the devices' messages are not read.

    def _flow_reset(self) -> None:
        """Forget what waits (the sessions it is for died with the connection)."""
        self._to_devices.clear()
        self._to_broker.clear()
        self._reading_broker = self._reading_devices = True
        self._reply_limit.clear()

    def _to_device(self, device: int, frames: list[Any]) -> None:
        if device in self._to_devices or not _try_send(self._pairs[device], frames):
            if self._to_devices.park(device, frames, time.monotonic()) and self._reading_broker:
                self._reading_broker = False
                self._poller.modify(self.dealer, 0)

    def _to_broker_send(self, frames: list[Any]) -> None:
        if self._to_broker or not _try_send(self.dealer, frames):
            if self._to_broker.park(None, frames, time.monotonic()) and self._reading_devices:
                self._reading_devices = False
                for pair in self._pairs:
                    self._poller.modify(pair, 0)

    def _retry(self) -> None:
        """Send what waits, in order, as far as the sockets take it; read again what was
        paused once the queue it fed drained to half."""
        for device in self._to_devices.keys():
            pair = self._pairs[device]
            self._to_devices.flush(device, lambda f, pair=pair: _try_send(pair, f))
        self._to_broker.flush(None, lambda f: _try_send(self.dealer, f))
        if not self._reading_broker and not self._to_devices.full_since:
            self._reading_broker = True
            self._poller.modify(self.dealer, zmq.POLLIN)
        if not self._reading_devices and not self._to_broker.is_full(None):
            self._reading_devices = True
            for pair in self._pairs:
                self._poller.modify(pair, zmq.POLLIN)

    def _too_large(self, header: protocol.Header, frames: list[Any], limit: int) -> list[Any]:
        """In place of a REPLY or TRANSFER bigger than the way ahead takes: the same message
        carrying ``MessageTooLarge`` (a frame too big would cost the connection)."""
        size = largest_frame(frames)
        if header.kind == Kind.REPLY:
            error = MessageTooLarge(
                f"The array read is {size_text(size)}, more than the {size_text(limit)} the "
                "way to the client takes in one message: read it in slices "
                "(t[:n].numpy()), or raise --max-message-bytes on the broker and workers "
                "and max_message_bytes= on the client.", size=size, limit=limit)
            return protocol.encode(Message(Kind.REPLY, header.session, header.request,
                                           {"error": error.to_wire()}))
        error = MessageTooLarge(
            f"The tensor moved with .to() is {size_text(size)}, more than the "
            f"{size_text(limit)} the broker takes in one message: move it in slices, or "
            "raise --max-message-bytes on the broker and workers.", size=size, limit=limit)
        body = protocol.unpack_body(frames[1])  # this worker's own TRANSFER: a valid map
        return protocol.encode(Message(Kind.TRANSFER, header.session, header.request,
                                       {"id": body.get("id"), "error": error.to_wire()}))

    def _reconcile(self, frames: list[Any]) -> None:
        """Close every session the broker's heartbeat does not list: the broker forgot it
        (its CLOSE may have been lost), so nothing will ever close it otherwise."""
        try:
            listed = protocol.unpack_body(frames[1]).get("sessions")
        except FabricError:
            return
        if not isinstance(listed, list):
            return
        known = set(listed)
        for session in [s for s in self._session_device if s not in known]:
            log.info("session %#x is gone from the broker: closing it here", session)
            self._to_device(self._session_device.pop(session),
                            protocol.encode(Message(Kind.CLOSE, session)))
            self._reply_limit.pop(session, None)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until ``stop()``; reconnect and re-register whenever the broker is lost."""
        try:
            self._connect()
            last_heard = last_sent = time.monotonic()
            while self._running:
                waiting = bool(self._to_devices or self._to_broker)
                for sock, _ in self._poller.poll(5 if waiting else
                                                 min(100, self.heartbeat * 1000)):
                    if sock is self.dealer:
                        last_heard = time.monotonic()
                        self._from_broker(self.dealer.recv_multipart(copy=False))
                    elif sock is self._monitor:
                        self._on_handshake_failed(recv_monitor_message(self._monitor))
                    else:
                        frames = sock.recv_multipart(copy=False)
                        self._from_device(frames)
                        last_sent = time.monotonic()
                if self._to_devices or self._to_broker:
                    self._retry()
                now = time.monotonic()
                if not self._reading_broker and self.dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    last_heard = now  # not read now, but the broker is there
                if now - last_heard > self.heartbeat * self.liveness:
                    log.warning("broker silent for %.1f s; reconnecting", now - last_heard)
                    self._connect()
                    last_heard = now
                elif now - last_sent >= self.heartbeat:
                    if not self._to_broker:  # else the broker is not reading anyway
                        self._send(Message(Kind.HEARTBEAT))
                    last_sent = now
        finally:
            self.close()

    def _from_device(self, frames: list[zmq.Frame]) -> None:
        header = protocol.decode_header(frames[0])
        if header.kind == Kind.TRANSFER and header.session in self._session_device:
            # Both sessions live on this worker: the tensor moves in memory, not via the broker.
            self._to_device(self._session_device[header.session], frames)
            return
        elif header.kind in (Kind.REPLY, Kind.TRANSFER):
            limit = (self._reply_limit.get(header.session, self._broker_limit)
                     if header.kind == Kind.REPLY else self._broker_limit)
            if largest_frame(frames) > limit:
                frames = self._too_large(header, frames, limit)
        self._to_broker_send(frames)

    def _from_broker(self, frames: list[zmq.Frame]) -> None:
        try:
            header = protocol.decode_header(frames[0])
        except FabricError as exc:
            log.warning("bad message from the broker: %s", exc)
            return
        if header.kind in (Kind.HEARTBEAT, Kind.PONG):
            if header.kind == Kind.HEARTBEAT and len(frames) > 1:
                self._reconcile(frames)
            return
        if header.kind in (Kind.REGISTERED, Kind.REJECT, Kind.ERROR) and header.session == 0:
            self._control_from_broker(protocol.decode(frames))
            return
        if header.kind == Kind.OPEN:
            body = protocol.decode(frames).body
            device = body["device"]
            if not 0 <= device < len(self.devices):
                self._send(protocol.error_message(
                    FabricError(f"This worker has no device {device}."), kind=Kind.REJECT,
                    session=header.session, request=header.request))
                return
            self._session_device[header.session] = device
            limit = body.get("max_message_bytes")
            if type(limit) is int and limit > 0:
                self._reply_limit[header.session] = min(limit, self._broker_limit)
        device = self._session_device.get(header.session)
        if device is None:
            if header.kind == Kind.CLOSE:
                self._send(Message(Kind.CLOSED, header.session, header.request))
            return
        if header.kind == Kind.CLOSE:
            # Forgotten here now, not when the device answers: the id may be opened again
            # before that answer comes, and the answer must not forget the new session.
            self._session_device.pop(header.session)
            self._reply_limit.pop(header.session, None)
        self._to_device(device, frames)

    def _control_from_broker(self, message: Message) -> None:
        if message.kind == Kind.REGISTERED:
            log.info("registered with %s", message.body["server"])
            limit = message.body.get("max_message_bytes")
            if type(limit) is int and limit > 0:
                self._broker_limit = limit
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
        for pair in self._pairs:
            pair.send(_STOP)
        for thread in self._threads:
            thread.join(timeout=5)
        for pair in self._pairs:
            pair.close(linger=0)
        self._close_dealer()
        self.context.term()


def serve(broker: str, **options: Any) -> None:
    """Run a worker in this process until SIGINT or SIGTERM."""
    worker = Worker(broker, **options)
    signal.signal(signal.SIGINT, worker.stop)
    signal.signal(signal.SIGTERM, worker.stop)
    log.info("worker %s: %d %s device(s), broker %s", worker.name, len(worker.devices),
             worker.backend, broker)
    worker.run()
