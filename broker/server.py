"""The broker process: two ROUTER sockets, one poll loop, and the registry.

Rule: this is the only broker module that knows about zmq. It receives frames without
copying, hands them to ``Registry`` and sends what it returns; data frames pass through as
the same ``zmq.Frame`` objects. Unroutable peers (``ROUTER_MANDATORY``) are reported back to
the registry as vanished, and a socket monitor on the workers' port tells the registry when
any of its connections closes, so that it asks the workers then. What a full peer cannot take
yet goes to the flow control (``broker.backpressure``), which decides when to cut a client, pause
the frontend or lose a worker; the loop retries its queues and reads the frontend only while it
allows. Answers with a not-before time (refused tokens) wait in a small timer queue
(``broker.held``) that the poll timeout respects. Peers authenticate in the ZeroMQ
handshake (PLAIN with a token as the password, or CURVE with an allowed key;
``fabric.core.security``): libzmq asks this loop over ZAP (a third ROUTER, ``broker.zap_gate``) and
the registry answers, so a peer without a token is never attached to either ROUTER. A peer with one
is still bounded in what it makes libzmq hold before this loop reads it (``fabric.core.intake``:
libzmq holds a multipart message whole, and bounds only its frames): each ROUTER's socket monitor
names its connections, every message read is credited to its connection, and one that holds more
than ``fabric.core.flow.connection_bytes_limit`` unread is cut (the registry counts and logs it).

With a peer (``PairSettings``), the broker is one of a Binary Star pair (``broker.pair``): it
publishes its state on a PUB socket of its own every pair heartbeat and at each change, and
reads the peer's on a SUB, both outside the data path (the registry asks the pair only at
HELLO, DEVICES and REGISTER). The state socket admits only the other broker (the worker token,
or with CURVE the pair's shared key); what arrives on it is bounded by the socket and
checked. A broker that steps down lets go of its workers and sessions.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import secrets
import signal
import socket
import sys
import time
import uuid
from typing import Any, Callable, Sequence

import msgpack
import zmq

from fabric.core.addresses import advertised
from fabric.core.errors import ConfigError
from fabric.core.flow import connection_bytes_limit
from fabric.core.intake import MONITORED, Intake
from fabric.core.security import (FRONTEND_DOMAIN, PAIR_DOMAIN, WORKERS_DOMAIN, CurveServer,
                                  authenticate_peers, present_token)
from fabric.core.sockets import (NOBLOCK, POLLIN, message_check, recv_frames, recv_monitor_event,
                                 send_frames, try_send)
from fabric.core.zap_messages import ZAP_ENDPOINT

from .backpressure import FlowControl, Peer, PeerUnreachable
from .held import HeldSends
from .metrics import MetricsPublisher
from .model import Limits, Send, Side
from .pair import Beat, Pair, PairSettings
from .registry import Registry
from .state_file import StateFile

log = logging.getLogger("fabric.broker")

RETRY_MS = 5  # how often parked messages are retried while there are any
_BEAT_BYTES = 256  # the most a state heartbeat may take (it takes about 40)


def _raise_open_file_limit() -> None:
    """Raise this process's open-file limit to its hard limit, where allowed: each peer's
    connection is a file, and a broker out of them cannot take its legitimate clients'."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
            return
    log.info("open-file limit: %d connections at most",
             resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _unpredictable_routing_counters() -> None:
    """Seed the C library's ``rand()``, from which libzmq 4.3.5 draws where each ROUTER starts
    numbering its peers (unseeded, the same numbers in every process). A peer admitted with
    a token can then no longer claim the number libzmq hands out next as its own routing id,
    which makes libzmq abort the process: it would have to guess among 2**32."""
    try:
        ctypes.CDLL(None).srand(secrets.randbits(32))
    except (OSError, AttributeError):  # no C library to reach: nothing to seed
        log.warning("could not seed rand(): libzmq numbers this broker's peers predictably")


def _router(context: zmq.Context, endpoint: str, limits: Limits,
            curve: CurveServer | None, domain: str, *,
            workers: bool = False) -> zmq.Socket:
    sock = context.socket(zmq.ROUTER)
    authenticate_peers(sock, domain, curve)  # (before bind)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    if workers:
        # Workers choose their sockets' (random) identities: a lane that reconnects under
        # its own replaces its old connection instead of waiting for it to die.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    # Bounded per-peer queues both ways, and no frame bigger than the limit (before bind:
    # accepted connections take the options the listener had).
    for option, value in ((zmq.SNDHWM, limits.hwm), (zmq.RCVHWM, limits.hwm),
                          (zmq.MAXMSGSIZE, limits.max_message_bytes),
                          (zmq.HANDSHAKE_IVL, int(limits.handshake_timeout * 1000))):
        sock.setsockopt(option, value)
    if not workers:
        # TCP keepalive drops a client's half-open connection (its host gone without a
        # word), which makes the client unroutable; the registry then learns it vanished at
        # the next send to it (its lease probe, at the latest). Not libzmq's ZMTP heartbeats:
        # libzmq 4.3.5 aborts the whole process when it heartbeats a connection that was
        # reset while the broker was not reading it (a client that sent more than RCVHWM
        # while the frontend was paused, then closed with replies unread; libzmq #4364 and
        # #4767), and drops connections merely paused by backpressure (#3937). Not towards
        # workers either: a worker's beacon runs them itself and asks (TTL) this end to close
        # its connection after heartbeat x liveness without a word, which libzmq does here
        # without heartbeating anything (``workers.control.zmtp_heartbeats``).
        interval = max(1, round(limits.heartbeat))  # (whole seconds, for the kernel)
        for option, value in ((zmq.TCP_KEEPALIVE, 1), (zmq.TCP_KEEPALIVE_IDLE, interval),
                              (zmq.TCP_KEEPALIVE_INTVL, interval),
                              (zmq.TCP_KEEPALIVE_CNT, limits.liveness)):
            sock.setsockopt(option, value)
    sock.bind(endpoint)
    return sock


class Broker:
    """A running broker: bound sockets and the registry. ``run()`` serves until ``stop()``."""

    def __init__(self, frontend: str, worker_address: str, *, client_token: str | Sequence[str],
                 worker_token: str, admin_token: str | None = None, limits: Limits = Limits(),
                 curve: CurveServer | None = None, state_file: str | None = None,
                 metrics: tuple[str, int] | None = None, advertise: str | None = None,
                 pair: PairSettings | None = None) -> None:
        _raise_open_file_limit()
        _unpredictable_routing_counters()  # before the ROUTERs draw their starts
        self.context = zmq.Context()
        # Bound before the ROUTERs, so no handshake is ever finished without asking it.
        self.zap = self.context.socket(zmq.ROUTER)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)
        self._pair_pub: zmq.Socket | None = None  # with a peer: the pair's state sockets
        self._pair_sub: zmq.Socket | None = None
        self.frontend = _router(self.context, frontend, limits, curve, FRONTEND_DOMAIN)
        self.workers = _router(self.context, worker_address, limits, curve, WORKERS_DOMAIN,
                               workers=True)
        self._held = HeldSends()  # answers to refused tokens, until their not_before
        server = f"fabric-broker {socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self.registry = Registry(client_token=client_token, worker_token=worker_token,
                                 admin_token=admin_token, server=server, limits=limits,
                                 now=time.monotonic(), endpoints={  # named to lost peers
                                     side: advertised(endpoint, advertise) if advertise
                                     else endpoint for side, endpoint in self.endpoints.items()},
                                 curve_keys=curve.allow_lists if curve is not None else None)
        self._sockets = {Side.FRONTEND: self.frontend, Side.WORKERS: self.workers,
                         Side.ZAP: self.zap}
        # What each ROUTER's connections hold unread, bounded; their monitors name them.
        held = connection_bytes_limit(limits.max_message_bytes)
        self._intakes = {side: Intake(self._sockets[side], held)
                         for side in (Side.FRONTEND, Side.WORKERS)}
        self._monitors = {self._sockets[side].get_monitor_socket(MONITORED): side
                          for side in self._intakes}
        self._state = StateFile(state_file, self.registry.worker_table) if state_file else None
        if self._state is not None:
            self._state.load()
            self.registry.reload_numbering = self._reload_numbering
        self._running = True
        self._flow = FlowControl(self.registry, limits)  # peers whose queue is full
        self._outbox = self._flow.outbox  # (the hot path's test: any parked for this peer?)
        self.registry.queue_figures = self._flow.figures
        # Prometheus' /metrics at (host, port), and the dashboard (for the admin token) beside
        # it: served from their own threads, off the latest snapshot (broker.metrics).
        self.metrics = (MetricsPublisher(*metrics, admin_token=admin_token)
                        if metrics is not None else None)
        self.pair_failed: ConfigError | None = None  # why the pair cannot go on, if so
        if pair is not None:
            self.registry.pair = Pair(primary=pair.primary, heartbeat=pair.heartbeat,
                                      liveness=pair.liveness, now=time.monotonic())
            self._pair_pub, self._pair_sub = self._pair_sockets(pair, curve, worker_token)
            self._next_beat = 0.0
            self._published = None  # the state last published

    def _reload_numbering(self) -> None:
        """Read the state file again (``Registry.began_serving``); one the other broker of the
        pair left unreadable is said, and the numbering this broker holds kept."""
        try:
            self._state.load()
        except ConfigError as exc:
            log.warning("pair: keeping this broker's device numbering: %s", exc.message)

    def _pair_sockets(self, pair: PairSettings, curve: CurveServer | None,
                      worker_token: str) -> tuple[zmq.Socket, zmq.Socket]:
        """The PUB this broker says its state on (admitting only the peer), and the SUB it
        hears the peer's on (bounded: tiny messages, a short queue)."""
        pub = self.context.socket(zmq.PUB)
        authenticate_peers(pub, PAIR_DOMAIN, curve)
        for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 4)):
            pub.setsockopt(option, value)
        pub.bind(pair.address)
        sub = self.context.socket(zmq.SUB)
        if curve is not None:  # (the pair shares its key pair)
            sub.curve_serverkey = curve.public_key
            sub.curve_publickey, sub.curve_secretkey = curve.public_key, curve.secret_key
        else:
            present_token(sub, "worker", worker_token)
        for option, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 16),
                              (zmq.MAXMSGSIZE, _BEAT_BYTES)):
            sub.setsockopt(option, value)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pair.peer)
        return pub, sub

    def _pair_tick(self, now: float) -> None:
        """Say this broker's state when due or changed (a knock may have changed it)."""
        pair = self.registry.pair
        if pair.state is not self._published:
            if self._published is not None:
                log.warning("pair: this broker is now %s (term %d): %s", pair.state.value,
                            pair.term, pair.why)
        elif now < self._next_beat:
            return
        self._published, self._next_beat = pair.state, now + pair.heartbeat
        try:
            self._pair_pub.send(msgpack.packb(pair.beat().to_wire()), zmq.NOBLOCK)
        except zmq.Again:  # (a PUB drops rather than blocks; said for completeness)
            pass

    def _hear_peer(self, now: float) -> None:
        """The peer's state heartbeats (a bounded batch); a step down lets go of the rest."""
        pair = self.registry.pair
        for _ in range(16):
            try:
                frame = self._pair_sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                beat = Beat.from_wire(msgpack.unpackb(frame))
            except (ValueError, msgpack.UnpackException):
                beat = None
            if beat is None:
                self.registry.counters["bad_pair_beats"] += 1
                continue
            try:
                change = pair.on_peer(beat, now)
            except ConfigError as exc:
                log.error("%s", exc.message)
                self.pair_failed, self._running = exc, False
                return
            if change is not None and change.stepped_down:
                self.registry.counters["pair_step_downs"] += 1
                self._send(self.registry.step_down())
            elif change is not None and pair.serving:
                self.registry.began_serving(now)
        self._pair_tick(now)

    @property
    def endpoints(self) -> dict[str, str]:
        """The bound addresses (with the actual port when bound to ``*``)."""
        bound = {"frontend": self.frontend.getsockopt_string(zmq.LAST_ENDPOINT),
                 "workers": self.workers.getsockopt_string(zmq.LAST_ENDPOINT)}
        if self._pair_pub is not None:
            bound["pair"] = self._pair_pub.getsockopt_string(zmq.LAST_ENDPOINT)
        return bound

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    def _send(self, sends: list[Send]) -> None:
        while sends:
            followups: list[Send] = []  # what the registry says once a peer proves gone
            for side, identity, frames, not_before in sends:
                if not_before:  # a refused token's answer: held, the loop goes on
                    if not self._held.hold(Send(side, identity, frames, not_before)):
                        # (the queue counts what it drops; status reports that count)
                        self.registry.counters["held_answers_dropped"] = self._held.dropped
                    continue
                if self._outbox.messages and (side, identity) in self._outbox:
                    # Behind what is already parked for it, in order.
                    followups += self._flow.park(side, identity, frames, time.monotonic())
                    continue
                try:
                    send_frames(self._sockets[side], [identity, *frames], NOBLOCK)
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        followups += self.registry.unroutable(side, identity,
                                                              time.monotonic())
                    elif exc.errno == zmq.EAGAIN:
                        followups += self._flow.on_queue_full(side, identity, frames,
                                                              time.monotonic())
                    else:
                        raise
            sends = followups

    def _try_send(self, peer: Peer, frames: Sequence[Any]) -> bool:
        """One parked message for ``FlowControl.retry``: False when the peer's queue is full."""
        side, identity = peer
        try:
            return try_send(self._sockets[side], [identity, *frames])
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerUnreachable from exc
            raise

    def _drain_monitor(self, monitor: zmq.Socket) -> None:
        """Feed a ROUTER's monitor events to its intake (connections accepted and gone); a
        worker's connection that closed (its process ended, or libzmq found its link silent)
        is asked about at once (``Registry.connection_closed``), once a batch, and a client
        whose connection closed soon after (``Registry.client_connection_closed``)."""
        side = self._monitors[monitor]
        intake, closed = self._intakes[side], False
        while monitor.poll(0):
            event = recv_monitor_event(monitor)
            peer = intake.on_event(event["event"], event["value"])
            closed |= event["event"] == zmq.EVENT_DISCONNECTED
            if peer is not None and side == Side.FRONTEND:
                self.registry.client_connection_closed(peer, time.monotonic())
        if closed and side == Side.WORKERS:
            self.registry.connection_closed(time.monotonic())

    def _check_intakes(self, now: float) -> float:
        """Cut the connections that hold too much unread; when the next check is due."""
        for side, intake in self._intakes.items():
            if now >= intake.due():
                for cut in intake.check(now):
                    self.registry.connection_cut(side, cut.peer, cut.held,
                                                 intake.ledger.limit, now)
        return min(intake.due() for intake in self._intakes.values())

    def run(self) -> None:
        """Serve until ``stop()`` (or SIGINT/SIGTERM when installed by ``main``)."""
        # What the loop polls, for zmq.zmq_poll itself (a Poller adds a Python call per pass).
        # Handshakes are answered (ZAP) even while the frontend is paused; connections are
        # counted (the monitors) all along.
        monitors = [(monitor, POLLIN) for monitor in self._monitors]
        # The peer's state first (outside the data path): a broker resumed after a stop hears
        # that the other took over before it reads a knock that came meanwhile.
        pair = [(self._pair_sub, POLLIN)] if self._pair_sub is not None else []
        both_sides = [*pair, (self.frontend, POLLIN), (self.workers, POLLIN), (self.zap, POLLIN),
                      *monitors]
        workers_only = [*pair, (self.workers, POLLIN), (self.zap, POLLIN),  # a worker's is full
                        *monitors]
        registry = self.registry
        blocking = self._flow.blocking  # while not empty, the frontend is not read
        # Per socket: the registry's handler, whether another message waits there, and
        # what credits a message read to its connection (None: the ZAP socket's are not).
        from_side = {sock: (handler, message_check(sock), took) for sock, handler, took in (
            (self.frontend, registry.from_client, self._intakes[Side.FRONTEND].took),
            (self.workers, registry.from_worker, self._intakes[Side.WORKERS].took),
            (self.zap, registry.zap.answer, None))}
        intake_due = 0.0
        try:
            while self._running and not registry.stopping:  # admin shutdown sets it
                now = time.monotonic()
                if now >= intake_due:
                    intake_due = self._check_intakes(now)
                wake = registry.next_deadline()
                if now >= wake:  # (not per message: tick scans all)
                    self._send(registry.tick(now))
                    wake = registry.next_deadline()
                if self._pair_pub is not None:
                    self._pair_tick(now)
                if self.metrics is not None and now >= self.metrics.due:
                    self.metrics.publish(registry, now, len(self._held))
                if self._held:
                    self._send(self._held.due(now))
                    wake = min(wake, self._held.next_deadline())
                timeout_ms = max(0.0, min(0.1, wake - now, intake_due - now)) * 1000
                if self._outbox.messages:  # retried soon: a queue drains without telling us
                    self._send(self._flow.retry(now, self._try_send))
                    timeout_ms = min(timeout_ms, RETRY_MS)
                for sock, _ in zmq.zmq_poll(workers_only if blocking else both_sides,
                                            int(timeout_ms)):
                    if sock in self._monitors:
                        self._drain_monitor(sock)
                        continue
                    if sock is self._pair_sub:
                        self._hear_peer(time.monotonic())
                        continue
                    # Drain a bounded batch per socket so one side cannot starve the other;
                    # a batch takes milliseconds at most, so it shares one reading of the clock.
                    handle, more, took = from_side[sock]
                    now = time.monotonic()
                    for _ in range(256):
                        frames = recv_frames(sock)
                        if took is not None:
                            took(frames)
                        self._send(handle(frames[0].bytes, frames[1:], now))
                        if blocking and sock is self.frontend:
                            break  # backpressure: a worker's queue is full
                        if not more():
                            break
                if self._state is not None:
                    self._state.save_if_changed()
            self._send(registry.shutdown())
        finally:
            self.close()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for monitor, side in self._monitors.items():
            self._sockets[side].disable_monitor()
            monitor.close(linger=0)
        self.frontend.close(linger=200)
        self.workers.disable_monitor()
        self.workers.close(linger=0)
        self.zap.close()
        for sock in (self._pair_pub, self._pair_sub):
            if sock is not None:
                sock.close(linger=0)
        self.context.term()


def serve(frontend: str, worker_address: str, *, client_token: str | Sequence[str],
          worker_token: str, admin_token: str | None = None, limits: Limits = Limits(),
          announce: Callable[[dict[str, Any]], None] | None = None,
          curve: CurveServer | None = None, state_file: str | None = None,
          metrics: tuple[str, int] | None = None, advertise: str | None = None,
          pair: PairSettings | None = None) -> None:
    """Run a broker in this process until SIGINT or SIGTERM; ``announce`` gets the endpoints.
    With ``curve`` both sockets are CURVE servers that admit only the keys of its allow-lists;
    without, PLAIN servers that admit only the broker's tokens. With ``state_file`` its device
    numbering is read from there and kept there; with ``metrics`` (host, port), Prometheus'
    /metrics is served there too; ``advertise`` is the host it names its ports by; with
    ``pair``, it is one broker of a pair (``broker.pair``) and serves only while active.
    Raises ConfigError when the pair's peer has this broker's role."""
    broker = Broker(frontend, worker_address, client_token=client_token,
                    worker_token=worker_token, admin_token=admin_token, limits=limits,
                    curve=curve, state_file=state_file, metrics=metrics, advertise=advertise,
                    pair=pair)
    signal.signal(signal.SIGINT, broker.stop)
    signal.signal(signal.SIGTERM, broker.stop)
    endpoints = broker.endpoints
    if broker.metrics is not None:
        endpoints["metrics"] = broker.metrics.url
        log.info("Prometheus metrics at %s", broker.metrics.url)
    log.info("broker serving clients on %s and workers on %s", endpoints["frontend"],
             endpoints["workers"])
    if announce is not None:
        announce(endpoints)
    broker.run()
    if broker.pair_failed is not None:
        raise broker.pair_failed
    log.info("broker stopped")


def announce_on_stdout(endpoints: dict[str, Any]) -> None:
    """Print the bound endpoints as one JSON line, for launchers that bind to port ``*``."""
    sys.stdout.write(json.dumps({"ready": "broker", **endpoints}) + "\n")
    sys.stdout.flush()
