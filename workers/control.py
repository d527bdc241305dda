"""The worker's link to the broker, sans I/O: registering, heartbeats, noticing a lost broker
and registering again, and what a failed security handshake means.

Rule: every decision about the worker's own connection to the broker lives here, as answers
to events (``start``, ``on_message``, ``on_handshake_failed``, ``on_probe``, ``tick``) that
return the actions the I/O loop (``workers.control_io``) performs: connect afresh under new
identities, send a message, attach the devices' lanes, probe the broker's mechanism. What
going on cannot fix raises a ``WorkerStops``: a refusal (``RegistrationRefused``), the
broker's client port reached instead of its workers' (``ClientPortReached``), or a broker
silent past ``give_up_after`` (``BrokerSilent``). No sockets, no threads, no
clock: the loop passes ``now``.

Every REGISTER carries this process's random instance id, so that the broker lets the same
process, reconnected under new identities, replace its own registration at once (a broker
that stalled may still count the old connection as live). A registration refused because a
live worker holds this worker's name (``WorkerNameTaken``)
is retried (each HEARTBEAT the broker does not know is answered by registering again) for
the broker's liveness bound and one heartbeat more: the holder may be this worker's own
previous process, whose end the broker has not noticed yet. Refused still, the name is
really another worker's, and the worker stops with the broker's sentence.

Timing: the worker says HEARTBEAT every ``heartbeat`` seconds; a broker silent for more than
``heartbeat * liveness`` seconds is gone, and the worker connects again (its sessions died
with the connection that knew them). A REGISTER is sent once per connection, and again when
the broker answers that it does not know the worker (it restarted behind the same address).
The silent broker is named in the log line, with a note when its host name does not resolve.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import zmq

from fabric.core import protocol
from fabric.core.addresses import host_not_resolving
from fabric.core.errors import (
    AuthenticationError,
    FabricError,
    VersionMismatch,
    WorkerNameTaken,
    WrongPort,
    error_from_wire,
)
from fabric.core.protocol import Kind, Message
from fabric.core.security import explain_handshake, probe_needed
from fabric.core.sockets import new_routing_id

log = logging.getLogger("fabric.worker")

_QUIET = frozenset({Kind.HEARTBEAT, Kind.PONG})  # the lanes' heartbeats list the sessions
_CONTROL = frozenset({Kind.REGISTERED, Kind.REJECT, Kind.ERROR})  # with session 0
_LINKS = frozenset({Kind.LINK_GRANT, Kind.LINK_EXPECT})  # for the direct links (a session's)


class WorkerStops(Exception):
    """The worker stops with this sentence: going on cannot help. ``exit_code`` is what
    ``fabric worker`` exits with."""

    exit_code = 1


class RegistrationRefused(WorkerStops):
    """The broker refused this worker for a reason retrying cannot fix."""


class ClientPortReached(WorkerStops):
    """The worker was given the broker's client port: a usage error (exit code 2)."""

    exit_code = 2


class BrokerSilent(WorkerStops):
    """No broker answered for ``give_up_after`` seconds (a supervisor may start the worker
    elsewhere)."""


@dataclass(frozen=True)
class Connect:
    """Drop the connection (if any) and its sessions; connect again as ``identity``, each
    device's lane as its identity in ``lanes``."""

    identity: bytes
    lanes: tuple[bytes, ...]


@dataclass(frozen=True)
class Send:
    """Send ``message`` on the worker's own socket."""

    message: Message


@dataclass(frozen=True)
class Attach:
    """Registered: each device's lane says HEARTBEAT (so the broker can route to it), and its
    replies are held to ``max_message_bytes``, the largest message the broker takes."""

    max_message_bytes: int


@dataclass(frozen=True)
class Probe:
    """Ask the broker's address which security mechanism it announces (a short blocking TCP
    probe), and hand the answer to ``Control.on_probe(event, value, mechanism)``."""

    event: int
    value: int


@dataclass(frozen=True)
class Link:
    """Hand the broker's ``message`` about a direct link to the worker's ``BulkLinks``."""

    message: Message


Action = Union[Connect, Send, Attach, Probe, Link]


class Control:
    """The worker's control machine; see the module's rule.

    ``registration``: the REGISTER body without its lanes (token, name, backend, the devices'
    settings, the largest message the worker takes). ``give_up_after``: seconds without a
    word from the broker after which the worker stops (``BrokerSilent``) [default: never].
    ``host_not_resolving``: what to say of the broker's address when it stays silent.
    ``report``: the body of each HEARTBEAT (what the devices did, for the broker's metrics).
    """

    def __init__(self, registration: dict[str, Any], *, broker: str, encrypted: bool,
                 heartbeat: float, liveness: int, give_up_after: float | None = None,
                 new_identity: Callable[[], bytes] = new_routing_id,
                 host_not_resolving: Callable[[str], str | None] = host_not_resolving,
                 report: Callable[[], dict[str, Any]] = dict) -> None:
        self.registration = registration
        self.broker = broker
        self.give_up_after = give_up_after
        self.host_not_resolving = host_not_resolving
        self.report = report
        self.encrypted = encrypted
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.new_identity = new_identity
        self.lanes: tuple[bytes, ...] = ()
        self.last_heard = self.last_sent = 0.0  # (last_heard: moved on at each reconnection)
        self.answered = 0.0  # when the broker last said anything
        self.warned = False  # about a failed handshake, once per connection
        self.name_refused_since: float | None = None  # first WorkerNameTaken since registered
        self.instance = os.urandom(16)  # this process, over all its connections

    @property
    def tick_every(self) -> float:
        """The longest the loop may wait between two ``tick`` calls, in seconds."""
        return min(0.1, self.heartbeat)

    def start(self, now: float) -> list[Action]:
        """The first connection."""
        self.last_heard = self.last_sent = self.answered = now
        return self._connect()

    def tick(self, now: float) -> list[Action]:
        """Time passed: connect again to a silent broker, or say HEARTBEAT when due."""
        if self.give_up_after is not None and now - self.answered > self.give_up_after:
            raise BrokerSilent(
                f"The broker at {self.broker} has said nothing for {now - self.answered:.1f} "
                f"s (--give-up-after {self.give_up_after:g}): stopping."
                + self._unresolved())
        if now - self.last_heard > self.heartbeat * self.liveness:
            log.warning("the broker at %s has been silent for %.1f s; reconnecting.%s",
                        self.broker, now - self.last_heard, self._unresolved())
            self.last_heard = now
            return self._connect()
        if now - self.last_sent >= self.heartbeat:
            self.last_sent = now
            return [Send(Message(Kind.HEARTBEAT, body=self.report()))]
        return []

    def on_message(self, frames: Sequence[Any], now: float) -> list[Action]:
        """A message came on the worker's own socket (anything heard shows the broker lives)."""
        self.last_heard = self.answered = now
        try:
            header = protocol.decode_header(frames[0])
        except FabricError as exc:
            log.warning("bad message from the broker: %s", exc)
            return []
        if header.kind in _QUIET:
            return []
        if header.kind in _CONTROL and header.session == 0:
            return self._from_broker(protocol.decode(frames, header), now)
        if header.kind in _LINKS:
            try:
                return [Link(protocol.decode(frames, header))]
            except FabricError as exc:
                log.warning("bad message from the broker: %s", exc)
                return []
        log.warning("a %s message for a session came on the worker's own socket, not on a "
                    "device's lane: dropped", header.kind.name)
        log.debug("the session of that %s message: %#x", header.kind.name, header.session)
        return []

    def on_handshake_failed(self, event: int, value: int) -> list[Action]:
        """The socket monitor reported a failed security handshake (libzmq goes on retrying
        by itself): explain it once per connection, or stop where retrying cannot help."""
        if self.warned:
            return []
        if probe_needed(event, value):
            return [Probe(event, value)]
        return self.on_probe(event, value, None)

    def on_probe(self, event: int, value: int, mechanism: str | None) -> list[Action]:
        """The answer to a ``Probe``: the mechanism the broker announces (None: unknown)."""
        error = explain_handshake(event, value, self.broker, encrypted=self.encrypted,
                                  mechanism=mechanism, role="worker")
        if error is None:
            return []
        if (event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                or error.details.get("reason") == "mechanism_mismatch"):
            raise RegistrationRefused(error.message)  # retrying with these keys cannot help
        log.warning("%s", error.message)
        self.warned = True
        return []

    def _unresolved(self) -> str:
        """' ' and the sentence saying the broker's host name does not resolve, if it does
        not ('' otherwise)."""
        words = self.host_not_resolving(self.broker)
        return f" {words}" if words else ""

    def _connect(self) -> list[Action]:
        # Sessions die with the connection that knew them; every socket starts afresh, under
        # a new identity (the broker may not yet have dropped the old ones).
        self.lanes = tuple(self.new_identity() for _ in self.registration["devices"])
        self.warned = False
        return [Connect(self.new_identity(), self.lanes), self._register()]

    def _register(self) -> Send:
        return Send(Message(Kind.REGISTER, body={**self.registration, "lanes": list(self.lanes),
                                                 "instance": self.instance}))

    def _from_broker(self, message: Message, now: float) -> list[Action]:
        if message.kind == Kind.REGISTERED:
            log.info("registered with %s", message.body["server"])
            self.name_refused_since = None
            limit = message.body.get("max_message_bytes")
            ours = self.registration["max_message_bytes"]
            return [Attach(limit if type(limit) is int and limit > 0 else ours)]
        error = error_from_wire(message.body)
        if isinstance(error, (AuthenticationError, VersionMismatch)):
            raise RegistrationRefused(error.message)
        if isinstance(error, WrongPort):
            raise ClientPortReached(f"{error.message} (The address was {self.broker}.)")
        if isinstance(error, WorkerNameTaken):
            return self._name_taken(error, now)
        if error.details.get("reason") == "not_registered":
            log.warning("the broker does not know this worker (it restarted?): registering")
            return [self._register()]
        log.warning("the broker reported: %s", error.message)
        return []

    def _name_taken(self, error: WorkerNameTaken, now: float) -> list[Action]:
        """A live worker holds this name: wait (see the module's rule), then stop."""
        alive_for = error.details.get("alive_for")
        if not isinstance(alive_for, (int, float)):
            alive_for = self.heartbeat * self.liveness
        if self.name_refused_since is None:
            self.name_refused_since = now
            log.warning("%s Trying again for %.1f s in case it is this worker's previous "
                        "process.", error.message, alive_for + self.heartbeat)
        elif now - self.name_refused_since > alive_for + self.heartbeat:
            raise RegistrationRefused(error.message)
        return []
