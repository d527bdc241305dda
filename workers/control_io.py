"""The worker process, its I/O: a control thread that talks to the broker, one thread per
device (``workers.lane_io``).

Rule: the control thread never computes and never carries a session's traffic. It owns the
worker's DEALER to the broker and performs what the sans-I/O control machine
(``workers.control``: registration, heartbeats, noticing a lost broker and registering
again) asks for; each device thread owns its lane to the broker. The control thread speaks
to each device thread over an inproc PAIR (the commands are ``workers.lane_io``'s) and never
waits for one: what a full pair cannot take waits in a bounded queue, and a worker told to
stop while a device computes a long op ends a few seconds later (``_STOP_WAIT``), without
waiting for the op. A worker runs as its one options record says (``WorkerOptions``, built
by ``fabric worker`` or a caller of ``serve``), and reads no other setting.

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

import itertools
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import zmq

from fabric.core import cross_memory, protocol
from fabric.core.flow import Outbox
from fabric.core.protocol import (MAX_REPORTED_SESSIONS, Kind, LinkReport, WorkerReport,
                                  report_body)
from fabric.core.security import announced_mechanism
from fabric.core.sockets import recv_frames, recv_monitor_event, try_send
from fabric.core.version import __version__
from fabric.core.worker_options import WorkerOptions, default_worker_threads

from .backends import device_class, prepare
from .control import (Action, Attach, Connect, Control, Drop, Link, Probe, RegistrationRefused,
                      Send)
from .direct_links import LINK_THRESHOLD, Fallback
from .direct_links_io import BulkLinks, reachable_host
from .executor import Executor
from .heap import Heap
from .lane_io import (ATTACH, DROP, KEEP, LINK_READ, LINK_REPLY, RESET, STOP, DeviceThread,
                      dealer, pair_socket)
from .memory import MemoryBudget
from .shared_memory import HostSharing
from .threads import limit_threads

__all__ = ["RegistrationRefused", "Worker", "serve"]

log = logging.getLogger("fabric.worker")

HEAP_AT_START = 32 << 20  # bytes a worker's heap holds faulted in from its start
_STOP_WAIT = 5.0  # seconds a stopping worker waits, in all, for its device threads to end
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Worker:
    """A worker hosting its ``options``' devices for the broker at ``broker`` (or the one
    serving of a pair's, given as "ADDR,ADDR": ``workers.control``)."""

    def __init__(self, broker: str, options: WorkerOptions) -> None:
        cls = device_class(options.backend)  # refuses capture/remote before anything starts
        self.broker = broker.split(",")[0]
        self.options = options
        self.context = zmq.Context()
        self.devices = [cls.for_worker(i, options) for i in range(options.devices)]
        # Direct links (``workers.direct_links``) on the address that reaches the broker, or
        # another the worker is reached at; None: every tensor moved to another worker takes the
        # broker.
        host = (reachable_host(broker.split(",")[0]) if options.bulk_host == "auto"
                else options.bulk_host)
        self.links = None if host is None else BulkLinks(
            self.context, host, options.curve, options.max_message_bytes, self._deliver,
            self._read_over_link)
        # TRANSFERs whose links a takeover's new connection closed (``_connect``): sent
        # through the new broker once registered, and once more a liveness window later
        # (their receiving worker may register after this one; the ticket admits one copy).
        self._after_register: list[Fallback] = []
        self._send_again: list[Fallback] = []
        self._send_again_at = 0.0
        self.control = Control(
            {"token": options.token, "name": options.name, "backend": options.backend,
             "devices": [d.settings() for d in self.devices],
             "max_message_bytes": options.max_message_bytes, "fabric_version": __version__,
             "host": socket.gethostname(),
             **({"bulk": self.links.advertised()} if self.links is not None else {})},
            broker=broker, encrypted=options.curve is not None, heartbeat=options.heartbeat,
            liveness=options.liveness, give_up_after=options.give_up_after,
            report=self.report, resume_grace=options.resume_grace, held=self.held)
        self._budget = MemoryBudget(options.memory_budget, options.devices)  # (the devices')
        self.sharing = HostSharing.of(options)
        self.heap: Heap | None = None  # (the process's, where ``serve`` runs it: kept while busy)
        self._executors = [Executor(device, options.memory_limit, self._budget, self.sharing)
                           for device in self.devices]
        for executor in self._executors:  # (a pair's worker: ``fabric.core.resume``)
            executor.records_replies = self.control.resume_grace > 0
        self._pairs: list[zmq.Socket] = []
        self._threads: list[threading.Thread] = []
        self._runners: list[DeviceThread] = []
        for i, executor in enumerate(self._executors):
            runner = DeviceThread(self, i, executor)
            self._runners.append(runner)
            pair = pair_socket(self.context, options.hwm)
            pair.bind(runner.pair_address)
            thread = threading.Thread(target=runner.run, name=f"device-{i}", daemon=True)
            thread.start()
            self._pairs.append(pair)
            self._threads.append(thread)
        self._running = True
        # Commands and tensors moving in memory, for device threads whose pair is full (see
        # _to_device and _retry).
        self._to_devices = Outbox(options.hwm, options.max_message_bytes)  # by device index
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
        links = self.links
        sessions = itertools.chain.from_iterable(runner.sessions() for runner in self._runners)
        return report_body(WorkerReport(
            self._budget.limit, tuple(runner.report() for runner in self._runners),
            0 if links is None else links.admissions.refused,
            LinkReport() if links is None else links.report(),
            tuple(itertools.islice(sessions, MAX_REPORTED_SESSIONS))))

    def held(self) -> list[Any]:
        """The sessions the devices keep for the broker that takes over (``workers.control``)."""
        return [report for runner in self._runners for report in runner.held()]

    # -- what the control machine asks for ------------------------------------------------

    def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if type(action) is Send:
                self._send(action.message)
            elif type(action) is Attach:
                self._fall_back(self._after_register)
                self._send_again, self._after_register = self._after_register, []
                self._send_again_at = time.monotonic() + (
                    self.options.heartbeat * self.options.liveness)
                for device in range(len(self.devices)):  # each lane says HEARTBEAT, so
                    self._to_device(device, [ATTACH, b"%d" % action.max_message_bytes])
            elif type(action) is Connect:
                self._connect(action)
            elif type(action) is Drop:
                for device in range(len(self.devices)):
                    self._to_device(device, [DROP])
            elif type(action) is Link and self.links is not None:
                self._fall_back(self.links.from_broker(action.message))
            elif type(action) is Probe:  # (blocks for at most half a second)
                mechanism = announced_mechanism(self.broker)
                self._perform(self.control.on_probe(action.event, action.value, mechanism))

    def _connect(self, connect: Connect) -> None:
        self._close_dealer()
        self._to_devices.clear()  # (for the sessions of the old connection)
        self.broker = self.control.broker  # (a pair's: the one this connection goes to)
        for device, lane in enumerate(connect.lanes):
            self._to_device(device, [RESET, lane, self.broker.encode(),
                                     KEEP if connect.keep else b""])
        self._set_reading_devices(True)
        self.dealer = dealer(self.context, self.options, connect.identity)
        # A refused key or mismatched encryption is only ever a monitor event.
        self._monitor = self.dealer.get_monitor_socket(_HANDSHAKE_FAILED)
        self.dealer.connect(self.broker)
        # The link's end (the broker's, or libzmq's after its heartbeats went unanswered) is
        # the beacon's monitor's event.
        self.beacon = dealer(self.context, self.options, connect.beacon, heartbeats=True)
        self._beacon_monitor = self.beacon.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.beacon.connect(self.broker)
        self._poller = zmq.Poller()
        for sock in (self.dealer, self._monitor, self.beacon, self._beacon_monitor,
                     *self._pairs):
            self._poller.register(sock, zmq.POLLIN)
        if self.links is not None:
            waiting = self.links.watch(self._poller)
            # A pair's takeover keeps the sessions, and so the tensors they moved
            self._after_register = self._after_register + waiting if connect.keep else []
            self._send_again = []

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
            self._to_device(device, [LINK_READ, routing, *frames])

    def _transfer(self, frames: list[zmq.Frame]) -> None:
        if frames[0].bytes == LINK_REPLY:  # (a device's answer to a read on a link)
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
                if self._send_again and time.monotonic() >= self._send_again_at:
                    self._fall_back(self._send_again)
                    self._send_again = []
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
            try_send(pair, [STOP])  # (a full pair: its thread is busy, and is left behind)
        deadline = time.monotonic() + _STOP_WAIT
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.abandoned = [i for i, thread in enumerate(self._threads) if thread.is_alive()]
        for pair in self._pairs:
            pair.close(linger=0)
        self._close_dealer()
        if self.links is not None:
            self.links.close()
        self.sharing.copies.close()
        if self.abandoned:  # terminating the context would wait for their sockets (their ops)
            log.warning("device(s) %s still computing after %g s: stopping without them",
                        ", ".join(map(str, self.abandoned)), _STOP_WAIT)
            return
        self.context.term()


def serve(broker: str, options: WorkerOptions | None = None, **fields: Any) -> None:
    """Run a worker in this process until SIGINT or SIGTERM, as ``fabric worker`` does: with
    ``options``, or the record ``fields`` make (``WorkerOptions``' names; ``token`` and
    ``name`` at least). It limits the process's BLAS, OpenMP and numexpr threads
    (``options.threads``) and, for jax, sets XLA's environment before jax loads."""
    options = options or WorkerOptions(**fields)
    limit_threads(options.threads or default_worker_threads(options.devices))
    prepare(options.backend, options.devices)
    worker = Worker(broker, options)
    if options.shared_memory:  # (its first transfers find memory faulted in, which the heap
        cross_memory.keep_in_heap(HEAP_AT_START)  # keeps, and its copy threads started)
        worker.sharing.copies.start()
    worker.heap = Heap(len(worker.devices), HEAP_AT_START if options.shared_memory else 0)
    signal.signal(signal.SIGINT, worker.stop)
    signal.signal(signal.SIGTERM, worker.stop)
    log.info("worker %s: %d %s device(s), broker %s", options.name, len(worker.devices),
             options.backend, broker)
    freed_memory = cross_memory.freed_memory_note()
    if options.shared_memory and freed_memory is not None:
        log.info("%s", freed_memory)
    worker.run()
    if worker.abandoned:
        # The interpreter's exit would wait for their sockets forever (a daemon thread stops
        # at its next Python step, holding them open): end the process here.
        logging.shutdown()
        os._exit(0)
