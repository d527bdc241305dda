"""Fault injection for end-to-end tests: a lossy link between broker and worker, paused
processes, and client threads that check the invariant on every call.

Rule: everything here ends what it starts (threads joined, sockets closed, SIGCONT after
SIGSTOP) when its ``with`` block ends, and every loop is bounded in time. Nothing mocks
fabric: the proxy forwards real frames between a real broker and a real worker process.

- ``FaultProxy``: a ZeroMQ-level proxy, a ROUTER the worker connects to and, per worker
  socket, a DEALER to the broker's workers socket, forwarding frames with knobs to drop every Nth
  message, delay every message, hold everything (a pause), or lose everything (a partition).
  The worker's link stays alive through it meanwhile (libzmq's heartbeats end at the proxy):
  to the broker the worker is busy, not gone. What ends is passed on: a worker socket the
  proxy can no longer reach (its process ended, or stopped past the liveness bound, which
  the worker's beacon asks the proxy's libzmq to keep) has its DEALER closed, so the broker
  finds its beacon gone as it would without the proxy.
- ``stopped(process)``: SIGSTOP for the ``with`` block, SIGCONT after, whatever happens.
- ``ClientLoop``: a thread with its own sessions that makes calls whose right answer is known
  and records each outcome: right, a typed ``FabricError``, or a violation (a wrong value,
  an untyped exception, a call past its deadline).
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import zmq
from polling import wait_for
from rawpeers import AdmittingContext, ServerThread

import fabric
from fabric.core import protocol
from fabric.core.security import present_token

TO_BROKER, TO_WORKER = "to_broker", "to_worker"
MAX_IN_FLIGHT = 10_000  # messages the proxy holds per direction; more are dropped, counted
# A worker socket nothing came from or for in this long is gone (the broker heartbeats each
# live one several times a second in these tests): its DEALER to the broker is closed.
PEER_IDLE = 3.0


class FaultProxy(ServerThread):
    """A lossy link between a broker's workers socket and one worker; a context manager.

    Start the worker with ``--broker proxy.address`` (see ``start_worker_via``). Knobs, safe
    to change from any thread while it runs: ``drop_every`` (drop every Nth message each
    way; 0 is never), ``delay`` (seconds each message waits; order is kept), ``hold()`` /
    ``release()`` (keep everything until released: a pause), and ``partition`` (drop
    everything). ``counts`` says what happened to how many messages, per direction, and
    ``received`` how many of each kind came from either side (held or dropped ones too).
    """

    def __init__(self, upstream: str, worker_token: str) -> None:
        super().__init__(FaultProxy._serve)  # started, stopped and checked by ServerThread
        self.upstream = upstream
        self.worker_token = worker_token  # what its DEALERs show the broker, for the worker
        self.drop_every = 0
        self.delay = 0.0
        self.partition = False
        self._held = False
        self.counts: collections.Counter[str] = collections.Counter()
        self.received: collections.Counter[protocol.Kind | None] = collections.Counter()
        self._lock = threading.Lock()

    def hold(self) -> None:
        """Keep every message from now on until ``release()`` (both ways)."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        """Let held messages go on, in order."""
        with self._lock:
            self._held = False

    def heal(self) -> None:
        """Turn every fault off (held messages go on)."""
        with self._lock:
            self.drop_every, self.delay, self.partition, self._held = 0, 0.0, False, False

    # -- the thread --------------------------------------------------------------------------

    def _serve(self) -> None:
        # The worker's handshakes are admitted whatever its token; its DEALERs show the broker
        # the worker token.
        with AdmittingContext() as admitting:
            worker_side = admitting.router()
            upstream: dict[bytes, zmq.Socket] = {}  # per worker socket, a DEALER to the broker
            try:
                worker_side.setsockopt(zmq.ROUTER_MANDATORY, 1)
                worker_side.setsockopt(zmq.ROUTER_HANDOVER, 1)  # as the broker's does
                worker_side.bind("tcp://127.0.0.1:*")
                self.address = worker_side.getsockopt_string(zmq.LAST_ENDPOINT)
                self.ready.set()
                self._forward(admitting.context, worker_side, upstream)
            finally:
                worker_side.close(linger=0)
                for sock in upstream.values():
                    sock.close(linger=0)

    def _forward(self, context: zmq.Context, worker_side: zmq.Socket,
                 upstream: dict[bytes, zmq.Socket]) -> None:
        # The worker's sockets (its own and each device's lane) are told apart by the
        # identity they chose, so each gets its own DEALER to the broker under that identity.
        queues: dict[str, collections.deque[tuple[float, tuple[bytes, list[bytes]]]]] = {
            TO_BROKER: collections.deque(), TO_WORKER: collections.deque()}
        seen = collections.Counter()  # messages seen per direction, for drop_every
        peer_of: dict[zmq.Socket, bytes] = {}
        last_heard: dict[bytes, float] = {}  # per worker socket, traffic either way
        poller = zmq.Poller()
        poller.register(worker_side, zmq.POLLIN)
        while not self.stop.is_set():
            now = time.monotonic()
            for peer in [p for p, heard in last_heard.items() if now - heard > PEER_IDLE]:
                dealer = upstream.pop(peer)
                poller.unregister(dealer)
                del peer_of[dealer], last_heard[peer]
                dealer.close(linger=0)
            for sock, _ in poller.poll(5):
                for _ in range(100):  # a bounded batch, then the other side's turn
                    if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        break
                    frames = sock.recv_multipart()
                    if sock is worker_side:
                        peer, frames, direction = frames[0], frames[1:], TO_BROKER
                        # A worker socket gets its DEALER when it first speaks; its beacon,
                        # which never does, when REGISTER names it.
                        for socket_id in (peer, _beacon(frames)):
                            if socket_id and socket_id not in upstream:
                                dealer = upstream[socket_id] = context.socket(zmq.DEALER)
                                dealer.setsockopt(zmq.LINGER, 0)
                                dealer.setsockopt(zmq.ROUTING_ID, socket_id)
                                present_token(dealer, "worker", self.worker_token)
                                dealer.connect(self.upstream)
                                peer_of[dealer] = socket_id
                                last_heard[socket_id] = time.monotonic()
                                poller.register(dealer, zmq.POLLIN)
                    else:
                        peer, direction = peer_of[sock], TO_WORKER
                    last_heard[peer] = time.monotonic()
                    self.received[_kind(frames)] += 1
                    seen[direction] += 1
                    self._take(queues[direction], direction, seen[direction], (peer, frames))
            now = time.monotonic()
            with self._lock:
                held = self._held
            if held:
                continue
            gone: set[bytes] = set()  # worker sockets found unreachable
            for direction, queue in queues.items():
                while queue and queue[0][0] <= now:
                    peer, frames = queue[0][1]
                    try:
                        if direction == TO_BROKER and peer in upstream:
                            upstream[peer].send_multipart(frames, flags=zmq.NOBLOCK)
                        elif direction == TO_BROKER:
                            raise zmq.ZMQError(zmq.EHOSTUNREACH)  # closed, idle
                        else:
                            worker_side.send_multipart([peer, *frames], flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break  # the next hop is full: keep it, in order
                    except zmq.ZMQError as exc:
                        if exc.errno != zmq.EHOSTUNREACH:
                            raise
                        self.counts[f"{direction}_unroutable"] += 1
                        if direction == TO_WORKER:
                            gone.add(peer)
                    else:
                        self.counts[f"{direction}_forwarded"] += 1
                    queue.popleft()
            for peer in gone & set(upstream):  # closed towards the broker too
                dealer = upstream.pop(peer)
                poller.unregister(dealer)
                del peer_of[dealer], last_heard[peer]
                dealer.close(linger=0)

    def _take(self, queue: collections.deque, direction: str, number: int,
              message: tuple[bytes, list[bytes]]) -> None:
        with self._lock:
            drop_every, delay, partition = self.drop_every, self.delay, self.partition
        if partition or (drop_every and number % drop_every == 0) \
                or len(queue) >= MAX_IN_FLIGHT:
            self.counts[f"{direction}_dropped"] += 1
            return
        queue.append((time.monotonic() + delay, message))


def _beacon(frames: list[bytes]) -> bytes | None:
    """The beacon a worker's REGISTER names (None: another message, or none named)."""
    if _kind(frames) != protocol.Kind.REGISTER:
        return None
    try:
        beacon = protocol.decode(frames).body.get("beacon")
    except fabric.ProtocolError:
        return None
    return beacon if isinstance(beacon, bytes) and beacon else None


def _kind(frames: list[bytes]) -> protocol.Kind | None:
    """The kind a message's header names (None: no fabric header)."""
    try:
        return protocol.decode_header(frames[0]).kind
    except fabric.ProtocolError:
        return None


def start_worker_via(cluster: fabric.LocalCluster, index: int, address: str,
                     ) -> subprocess.Popen:
    """Start (or restart) the cluster's worker ``index`` connected to ``address`` (a
    ``FaultProxy``) instead of the broker's port for workers."""
    bound = cluster.worker_address
    cluster.worker_address = address
    try:
        return cluster.start_worker(index)
    finally:
        cluster.worker_address = bound


@contextlib.contextmanager
def stopped(process: subprocess.Popen) -> Iterator[None]:
    """SIGSTOP ``process`` for the ``with`` block; SIGCONT after, whatever happens."""
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)


def open_fds() -> int:
    """How many file descriptors this process has open (sockets included)."""
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Outcomes:
    """What a ClientLoop's calls came to."""

    calls: int = 0
    right: int = 0
    typed: collections.Counter = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)

    def check(self, *, at_least_right: int = 1) -> None:
        """The invariant: no violation, and at least ``at_least_right`` right answers."""
        assert not self.violations, self.violations[:10]
        assert self.right >= at_least_right, self


class ClientLoop:
    """A thread that opens sessions with ``connect()`` (called in the thread, so the sockets
    are its own) and makes checked calls until the ``with`` block ends or ``max_calls``.

    Each call uploads a small random array, computes on the device and reads the result,
    compared with numpy. A ``FabricError`` is a typed failure (the session is then closed and
    a new one opened); a wrong value, any other exception, or a call that takes longer than
    ``deadline`` (its timeout plus slack) is a violation.
    """

    def __init__(self, connect: Callable[[], fabric.Session], *, deadline: float,
                 seed: int = 0, calls_per_session: int = 5, max_calls: int = 10_000,
                 pause: float = 0.0) -> None:
        self.connect = connect
        self.deadline = deadline
        self.calls_per_session = calls_per_session
        self.max_calls = max_calls
        self.pause = pause
        self.outcomes = Outcomes()
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"client-{seed}", daemon=True)

    def __enter__(self) -> "ClientLoop":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def stop(self, timeout: float | None = None) -> Outcomes:
        """Stop after the call in progress (which ends by its own deadline); join."""
        self._stop.set()
        self._thread.join(self.deadline * 3 if timeout is None else timeout)
        assert not self._thread.is_alive(), "a client thread hangs"
        return self.outcomes

    def wait(self, calls: int, timeout: float, right: int = 0) -> None:
        """Wait until the loop has made ``calls`` calls, ``right`` of them right, or has
        ended (AssertionError at the timeout)."""
        outcomes = self.outcomes
        wait_for(lambda: outcomes.calls >= calls and outcomes.right >= right
                 or not self._thread.is_alive(), timeout, f"{calls} calls, {right} right")

    def _timed(self, call: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return call()
        finally:
            took = time.monotonic() - started
            self.outcomes.calls += 1
            if took > self.deadline:
                self.outcomes.violations.append(f"a call took {took:.2f} s")

    def _run(self) -> None:
        outcomes = self.outcomes
        while not self._stop.is_set() and outcomes.calls < self.max_calls:
            session = None
            try:
                session = self._timed(self.connect)
                for k in range(self.calls_per_session):
                    if self._stop.is_set():
                        break
                    base = np.array([self._rng.random() for _ in range(self._rng.randint(1, 500))])
                    got = self._timed(lambda s=session, b=base, k=k:
                                      (s.asarray(b) * 2.0 + k).sum().numpy())
                    if np.isclose(got, (base * 2.0 + k).sum()):
                        outcomes.right += 1
                    else:
                        outcomes.violations.append(f"wrong result {got!r}")
                    if self.pause:
                        self._stop.wait(self.pause)
            except fabric.FabricError as exc:
                outcomes.typed[type(exc).__name__] += 1
                self._stop.wait(0.05)  # then a new session (not a busy loop of refusals)
            except Exception as exc:  # anything untyped breaks the invariant
                outcomes.violations.append(f"{type(exc).__name__}: {exc}")
            finally:
                if session is not None:
                    try:
                        self._timed(session.close)
                    except fabric.FabricError as exc:
                        outcomes.typed[type(exc).__name__] += 1
                    except Exception as exc:
                        outcomes.violations.append(f"close: {type(exc).__name__}: {exc}")
