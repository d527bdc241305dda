"""The broker process: two ROUTER sockets, one poll loop, and the registry.

Rule: this is the only broker module that knows about zmq. It receives frames without
copying, hands them to ``Registry`` and sends what it returns; data frames pass through as
the same ``zmq.Frame`` objects. Unroutable peers (``ROUTER_MANDATORY``) are reported back to
the registry as vanished.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any, Callable

import zmq

from .registry import Limits, Registry, Send, Side

log = logging.getLogger("fabric.broker")


def _router(context: zmq.Context, endpoint: str, limits: Limits) -> zmq.Socket:
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq's own transport heartbeats drop a half-open connection, which makes the peer
    # unroutable; the registry then learns it vanished at the next send to it.
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(limits.heartbeat * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(limits.heartbeat * limits.liveness * 1000))
    sock.bind(endpoint)
    return sock


class Broker:
    """A running broker: bound sockets and the registry. ``run()`` serves until ``stop()``."""

    def __init__(self, frontend: str, backend: str, *, client_token: str, worker_token: str,
                 admin_token: str | None = None, limits: Limits = Limits()) -> None:
        self.context = zmq.Context()
        self.frontend = _router(self.context, frontend, limits)
        self.backend = _router(self.context, backend, limits)
        server = f"fabric-broker {socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self.registry = Registry(client_token=client_token, worker_token=worker_token,
                                 admin_token=admin_token, server=server, limits=limits,
                                 now=time.monotonic())
        self._sockets = {Side.FRONTEND: self.frontend, Side.BACKEND: self.backend}
        self._running = True

    @property
    def endpoints(self) -> dict[str, str]:
        """The bound addresses (with the actual port when bound to ``*``)."""
        return {"frontend": self.frontend.getsockopt_string(zmq.LAST_ENDPOINT),
                "backend": self.backend.getsockopt_string(zmq.LAST_ENDPOINT)}

    def stop(self, *_: Any) -> None:
        """Ask the loop to finish; safe from a signal handler."""
        self._running = False

    def _send(self, sends: list[Send]) -> None:
        while sends:
            followups: list[Send] = []  # what the registry says once a peer proves gone
            for side, identity, frames in sends:
                try:
                    self._sockets[side].send_multipart([identity, *frames], copy=False,
                                                       flags=zmq.NOBLOCK)
                except zmq.ZMQError as exc:
                    if exc.errno == zmq.EHOSTUNREACH:
                        followups += self.registry.unroutable(side, identity, time.monotonic())
                    elif exc.errno == zmq.EAGAIN:
                        self.registry.counters[f"{side.value}_send_queue_full"] += 1
                        log.warning("%s peer %s is not reading; a message to it was dropped",
                                    side.value, identity.hex())
                    else:
                        raise
            sends = followups

    def run(self) -> None:
        """Serve until ``stop()`` (or SIGINT/SIGTERM when installed by ``main``)."""
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        registry = self.registry
        from_side = {self.frontend: registry.from_client, self.backend: registry.from_worker}
        try:
            while self._running and not registry.stopping:  # admin shutdown sets it
                now = time.monotonic()
                self._send(registry.tick(now))
                timeout_ms = max(0.0, min(0.1, registry.next_deadline() - now)) * 1000
                for sock, _ in poller.poll(timeout_ms):
                    # Drain a bounded batch per socket so one side cannot starve the other.
                    handle = from_side[sock]
                    # (EVENTS is checked instead of catching zmq.Again: the exception is slow.)
                    for _ in range(256):
                        frames = sock.recv_multipart(copy=False)
                        self._send(handle(frames[0].bytes, frames[1:], time.monotonic()))
                        if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                            break
            self._send(registry.shutdown())
        finally:
            self.close()

    def close(self) -> None:
        self.frontend.close(linger=200)
        self.backend.close(linger=0)
        self.context.term()


def serve(frontend: str, backend: str, *, client_token: str, worker_token: str,
          admin_token: str | None = None, limits: Limits = Limits(),
          announce: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Run a broker in this process until SIGINT or SIGTERM; ``announce`` gets the endpoints."""
    broker = Broker(frontend, backend, client_token=client_token, worker_token=worker_token,
                    admin_token=admin_token, limits=limits)
    signal.signal(signal.SIGINT, broker.stop)
    signal.signal(signal.SIGTERM, broker.stop)
    endpoints = broker.endpoints
    log.info("broker serving clients on %s and workers on %s", endpoints["frontend"],
             endpoints["backend"])
    if announce is not None:
        announce(endpoints)
    broker.run()
    log.info("broker stopped")


def announce_on_stdout(endpoints: dict[str, Any]) -> None:
    """Print the bound endpoints as one JSON line, for launchers that bind to port ``*``."""
    sys.stdout.write(json.dumps({"ready": "broker", **endpoints}) + "\n")
    sys.stdout.flush()
