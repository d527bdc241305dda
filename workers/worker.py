"""The worker process: a socket thread that talks to the broker, one thread per device.

Rule: the socket thread never computes. It owns the DEALER to the broker, heartbeats,
notices a lost broker and re-registers, and hands each session's messages to the thread of
the device that serves the session over an inproc PAIR. Device threads run ``Executor``;
a long op there never delays a heartbeat.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import zmq

from fabric import protocol
from fabric.errors import AuthenticationError, FabricError, VersionMismatch, error_from_wire
from fabric.protocol import Kind, Message

from .backends import device_class
from .executor import Executor

log = logging.getLogger("fabric.worker")

_STOP, _RESET = b"stop", b"reset"  # control frames on the inproc pairs


class RegistrationRefused(Exception):
    """The broker refused this worker for a reason retrying cannot fix."""


def _device_thread(context: zmq.Context, address: str, executor: Executor) -> None:
    pair = context.socket(zmq.PAIR)
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
                 memory_limit: int | None = None) -> None:
        cls = device_class(backend)  # refuses capture/remote before anything starts
        self.broker = broker
        self.token = token
        self.backend = backend
        self.name = name
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.context = zmq.Context()
        self.devices = [cls(i) for i in range(devices)]
        self._pairs: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        for i, device in enumerate(self.devices):
            address = f"inproc://device-{i}"
            pair = self.context.socket(zmq.PAIR)
            pair.bind(address)
            thread = threading.Thread(target=_device_thread, name=f"device-{i}", daemon=True,
                                      args=(self.context, address,
                                            Executor(device, memory_limit)))
            thread.start()
            self._pairs.append(pair)
            self._threads.append(thread)
        self._session_device: dict[int, int] = {}
        self._running = True
        self.dealer: zmq.Socket | None = None

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    # -- connection to the broker ----------------------------------------------------------

    def _connect(self) -> None:
        if self.dealer is not None:
            self.dealer.close(linger=0)
        for pair in self._pairs:  # sessions die with the broker connection that knew them
            pair.send(_RESET)
        self._session_device.clear()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(self.broker)
        self._poller = zmq.Poller()
        for sock in (self.dealer, *self._pairs):
            self._poller.register(sock, zmq.POLLIN)
        self._register()

    def _register(self) -> None:
        body = {"token": self.token, "name": self.name, "backend": self.backend,
                "devices": [d.settings() for d in self.devices]}
        self._send(Message(Kind.REGISTER, body=body))

    def _send(self, message: Message) -> None:
        self.dealer.send_multipart(protocol.encode(message), copy=False)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until ``stop()``; reconnect and re-register whenever the broker is lost."""
        try:
            self._connect()
            last_heard = last_sent = time.monotonic()
            while self._running:
                for sock, _ in self._poller.poll(min(100, self.heartbeat * 1000)):
                    if sock is self.dealer:
                        last_heard = time.monotonic()
                        self._from_broker(self.dealer.recv_multipart(copy=False))
                    else:
                        frames = sock.recv_multipart(copy=False)
                        self._from_device(frames)
                        last_sent = time.monotonic()
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

    def _from_device(self, frames: list[zmq.Frame]) -> None:
        header = protocol.decode_header(frames[0])
        if header.kind in (Kind.CLOSED, Kind.REJECT):  # the session is gone from the device
            self._session_device.pop(header.session, None)
        elif header.kind == Kind.TRANSFER and header.session in self._session_device:
            # Both sessions live on this worker: the tensor moves in memory, not via the broker.
            self._pairs[self._session_device[header.session]].send_multipart(frames, copy=False)
            return
        self.dealer.send_multipart(frames, copy=False)

    def _from_broker(self, frames: list[zmq.Frame]) -> None:
        try:
            header = protocol.decode_header(frames[0])
        except FabricError as exc:
            log.warning("bad message from the broker: %s", exc)
            return
        if header.kind in (Kind.HEARTBEAT, Kind.PONG):
            return
        if header.kind in (Kind.REGISTERED, Kind.REJECT, Kind.ERROR) and header.session == 0:
            self._control_from_broker(protocol.decode(frames))
            return
        if header.kind == Kind.OPEN:
            device = protocol.decode(frames).body["device"]
            if not 0 <= device < len(self.devices):
                self._send(protocol.error_message(
                    FabricError(f"This worker has no device {device}."), kind=Kind.REJECT,
                    session=header.session, request=header.request))
                return
            self._session_device[header.session] = device
        device = self._session_device.get(header.session)
        if device is None:
            if header.kind == Kind.CLOSE:
                self._send(Message(Kind.CLOSED, header.session, header.request))
            return
        self._pairs[device].send_multipart(frames, copy=False)

    def _control_from_broker(self, message: Message) -> None:
        if message.kind == Kind.REGISTERED:
            log.info("registered with %s", message.body["server"])
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
        if self.dealer is not None:
            self.dealer.close(linger=0)
        self.context.term()


def serve(broker: str, **options: Any) -> None:
    """Run a worker in this process until SIGINT or SIGTERM."""
    worker = Worker(broker, **options)
    signal.signal(signal.SIGINT, worker.stop)
    signal.signal(signal.SIGTERM, worker.stop)
    log.info("worker %s: %d %s device(s), broker %s", worker.name, len(worker.devices),
             worker.backend, broker)
    worker.run()
