"""The worker's link to the broker, sans I/O: registering, heartbeats, noticing a lost broker
and registering again, and what a failed security handshake means.

Rule: every decision about the worker's own connection to the broker lives here, as answers
to events (``start``, ``on_message``, ``on_beacon_up``, ``on_disconnected``,
``on_handshake_failed``, ``on_probe``, ``tick``) that return the actions the I/O loop
(``workers.control_io``) performs: connect afresh under new identities, send a message, attach
the devices' lanes, probe the broker's mechanism. What going on cannot fix raises a
``WorkerStops``: a refusal (``RegistrationRefused``), the broker's client port reached
instead of its workers' (``ClientPortReached``), or a broker silent past ``give_up_after``
(``BrokerSilent``). No sockets, no threads, no clock: the loop passes ``now``.

Every REGISTER carries this process's random instance id, so that the broker lets the same
process, reconnected under new identities, replace its own registration at once (a broker
that stalled may still count the old connection as live). A registration refused because a
live worker holds this worker's name (``WorkerNameTaken``)
is retried (each HEARTBEAT the broker does not know is answered by registering again) for
the broker's liveness bound and one heartbeat more: the holder may be this worker's own
previous process, whose end the broker has not noticed yet. Refused still, the name is
really another worker's, and the worker stops with the broker's sentence.

Liveness: busy is not dead. The worker says HEARTBEAT every ``heartbeat`` seconds (what its
devices did, for the broker's metrics), but whether the link lives is the transport's call
once the worker is registered. Each connection has a *beacon*, one more socket (listed in
REGISTER) that carries nothing but libzmq's own ZMTP heartbeats (``zmtp_heartbeats``), which
libzmq's I/O thread sends and answers without the GIL: a device thread holding the GIL, or a
process starved of a core, never stops them. libzmq closes the beacon's connection, at both
ends, when it heard nothing on it for ``heartbeat * liveness`` seconds (a process stopped, the
network between cut), and at once when the other end closes it (its process ended). (Its
own socket, because libzmq arms that bound at each PING and disarms it at any message: on a
socket that also carried data, a peer stopped after a message and before its next PING would
never be found out.) The loop's socket monitor reports the end as ``on_disconnected``, and
the worker connects again under new identities (its sessions died with the connection that
knew them). A broker that is only slow to say HEARTBEAT is waited for. Before REGISTERED,
when no session can be lost, a broker silent for ``heartbeat * liveness`` seconds is left for
a new connection as well, and named in the log line, with a note when its host name does not
resolve. A REGISTER is sent once per connection, as soon as its beacon is up and has had time
for two PINGs (``on_beacon_up``: the broker's libzmq counts the bound from the first PING it
got, so a worker stopped before it would never be found out, and must not hold a session
before), and again when the broker answers that it does not know the worker.

Several brokers (a pair: ``broker`` lists them, "tcp://A:5556,tcp://B:5556"): the worker
serves the one that takes it. It connects to one at a time; a broker that refuses it as passive
(``BrokerPassive``), a registered link that ends, and a broker silent for a heartbeat before
REGISTERED (a dead one: nothing answers) each move it on to the next, where it registers afresh.
A worker of a pair keeps its sessions when a registered link ends (``Connect.keep``), for
``resume_grace`` seconds: its REGISTER with the other broker reports them (``held``), and that
broker's heartbeats say which it keeps; registered nowhere by the end of the grace, the worker
drops them (``Drop``), as a single broker's worker does at once.
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
    BrokerPassive,
    FabricError,
    VersionMismatch,
    WorkerNameTaken,
    WrongPort,
    error_from_wire,
)
from fabric.core.protocol import Kind, Message
from fabric.core.resume import MAX_REPORTED
from fabric.core.security import explain_handshake, probe_needed
from fabric.core.sockets import new_routing_id

log = logging.getLogger("fabric.worker")

_PING_AT_LEAST_EVERY = 0.1  # seconds: the beacon's ZMTP heartbeats' longest interval
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
    device's lane as its identity in ``lanes``, and the link's beacon as ``beacon``."""

    identity: bytes
    lanes: tuple[bytes, ...]
    beacon: bytes = b""
    keep: bool = False  # the sessions stay, for the broker that takes over (a pair's)


@dataclass(frozen=True)
class Drop:
    """The sessions kept for a broker that takes over are dropped: their grace is over."""


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


Action = Union[Connect, Send, Attach, Probe, Link, Drop]


def ping_interval(heartbeat: float) -> float:
    """Seconds between two of the beacon's ZMTP PINGs: ``heartbeat``, a tenth of a second at
    most (a PING costs the peers nothing but a few bytes, and the first one gates REGISTER)."""
    return min(heartbeat, _PING_AT_LEAST_EVERY)


def zmtp_heartbeats(heartbeat: float, liveness: int) -> dict[int, int]:
    """The socket options of the worker's beacon that make libzmq keep the link's liveness: a
    PING every ``ping_interval``, the broker's libzmq asked (TTL) to close the connection
    after ``heartbeat * liveness`` seconds without a word from this one, and this one closing
    it after as long without an answer. (Never on a device's lane: libzmq 4.3.5 aborts a
    process whose heartbeating socket is not read, as a busy device's lane is not, when its
    peer resets the connection; the beacon is always read, by the control thread.)"""
    bound_ms = max(100, round(heartbeat * liveness * 1000))
    return {zmq.HEARTBEAT_IVL: max(1, round(ping_interval(heartbeat) * 1000)),
            zmq.HEARTBEAT_TTL: min(bound_ms, 6_553_500),  # (sent in deciseconds, 16 bits)
            zmq.HEARTBEAT_TIMEOUT: bound_ms}


class Control:
    """The worker's control machine; see the module's rule.

    ``registration``: the REGISTER body without its lanes (token, name, backend, the devices'
    settings, the largest message the worker takes). ``give_up_after``: seconds without a
    word from the broker after which the worker stops (``BrokerSilent``) [default: never].
    ``host_not_resolving``: what to say of the broker's address when it stays silent.
    ``report``: the body of each HEARTBEAT (what the devices did, for the broker's metrics).
    ``resume_grace``: seconds a worker of a pair keeps its sessions for the broker that
    takes over; ``held``: those sessions, as REGISTER reports them.
    """

    def __init__(self, registration: dict[str, Any], *, broker: str, encrypted: bool,
                 heartbeat: float, liveness: int, give_up_after: float | None = None,
                 new_identity: Callable[[], bytes] = new_routing_id,
                 host_not_resolving: Callable[[str], str | None] = host_not_resolving,
                 report: Callable[[], dict[str, Any]] = dict, resume_grace: float = 0.0,
                 held: Callable[[], list[Any]] = list) -> None:
        self.registration = registration
        self.brokers = tuple(broker.split(","))  # one, or a pair's (see the module's rule)
        self.broker = self.brokers[0]  # the one this worker connects to now
        self.give_up_after = give_up_after
        self.host_not_resolving = host_not_resolving
        self.report = report
        self.encrypted = encrypted
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.new_identity = new_identity
        self.lanes: tuple[bytes, ...] = ()
        self.beacon = b""  # the link's beacon (see the module's rule)
        self.last_heard = self.last_sent = 0.0  # (last_heard: moved on at each reconnection)
        self.answered = 0.0  # when the broker last said anything
        self.warned = False  # about a failed handshake, once per connection
        self.registered = False  # REGISTERED on this connection (and not forgotten since)
        self.register_sent = False  # REGISTER sent on this connection
        self.register_due: float | None = None  # when it goes (its beacon is up)
        self.name_refused_since: float | None = None  # first WorkerNameTaken since registered
        self.instance = os.urandom(16)  # this process, over all its connections
        # A pair's worker keeps its sessions from when its registered link ended, for the
        # grace (0: it keeps none for another broker).
        self.resume_grace = resume_grace if len(self.brokers) > 1 else 0.0
        self.held = held
        self.holding_since: float | None = None

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
        if (self.holding_since is not None and not self.registered
                and now - self.holding_since > self.resume_grace):
            log.warning("no broker took this worker within %g s (--resume-grace): its "
                        "sessions are dropped", self.resume_grace)
            self.holding_since = None
            return [Drop()]
        if not self.registered and now - self.last_heard > self._silence_bound:
            log.warning("the broker at %s has been silent for %.1f s; reconnecting%s.%s",
                        self.broker, now - self.last_heard, self._turn_to_next_broker(),
                        self._unresolved())
            self.last_heard = now
            return self._connect()
        if not self.register_sent:  # (no HEARTBEAT before it: the broker would not know it)
            if self.register_due is None or now < self.register_due:
                return []
            self.register_sent, self.last_sent = True, now  # (HEARTBEATs count from here)
            self._lives(now)  # (its answer is awaited from here)
            return [self._register()]
        if now - self.last_sent >= self.heartbeat:
            self.last_sent = now
            return [Send(Message(Kind.HEARTBEAT, body=self.report()))]
        return []

    def on_beacon_up(self, now: float) -> list[Action]:
        """The socket monitor reported the beacon's handshake done: REGISTER goes two PINGs
        later (at a ``tick``), once the broker's libzmq counts the link's liveness bound."""
        if self.register_due is None:
            self.register_due = now + 2 * ping_interval(self.heartbeat)
            self._lives(now)  # (its process finished the handshake)
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

    def on_disconnected(self, now: float) -> list[Action]:
        """The socket monitor reported the beacon's connection closed: by the broker's end, or
        by libzmq after ``heartbeat * liveness`` seconds of silence on it. Registered, the
        worker connects afresh (the broker forgets what that connection held); before, libzmq
        connects again by itself."""
        if not self.registered:
            return []
        log.warning("the connection to the broker at %s closed (the broker ended, or its link "
                    "was silent for %g s); reconnecting%s.%s", self.broker,
                    self.heartbeat * self.liveness, self._turn_to_next_broker(),
                    self._unresolved())
        self.last_heard = now
        if self.resume_grace > 0:
            self.holding_since = now
        return self._connect()

    def _lives(self, now: float) -> None:
        """A pair's broker showed it lives: its heartbeat of silence counts from ``now`` (a
        single broker's bound is long enough to count from the connection)."""
        if len(self.brokers) > 1:
            self.last_heard = now

    @property
    def _silence_bound(self) -> float:
        """Seconds an unregistered connection may stay silent before the worker tries again:
        the liveness bound for one broker; for a pair (the other may serve) a heartbeat, but
        longer than the wait from the beacon's handshake to REGISTER (``on_beacon_up``)."""
        if len(self.brokers) == 1:
            return self.heartbeat * self.liveness
        return max(self.heartbeat, 3 * ping_interval(self.heartbeat))

    def _turn_to_next_broker(self) -> str:
        """Turn to the next broker of a pair (this connection's, from now), and say so for the
        log: ' to <its address>' ('', and nothing changed, for a single broker)."""
        if len(self.brokers) == 1:
            return ""
        self.broker = self.brokers[(self.brokers.index(self.broker) + 1) % len(self.brokers)]
        return f" to {self.broker}"

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
        self.warned = self.registered = self.register_sent = False
        self.register_due = None
        identity = self.new_identity()
        self.beacon = self.new_identity()
        return [Connect(identity, self.lanes, self.beacon,  # (REGISTER: see on_beacon_up)
                        keep=self.holding_since is not None)]

    def _register(self) -> Send:
        # (at most MAX_REPORTED, within REGISTER's bounded body: any more are not resumable)
        held = ([report.to_wire() for report in self.held()[:MAX_REPORTED]]
                if self.holding_since is not None else [])
        return Send(Message(Kind.REGISTER, body={**self.registration, "lanes": list(self.lanes),
                                                 "beacon": self.beacon,
                                                 "instance": self.instance,
                                                 **({"sessions": held} if held else {})}))

    def _from_broker(self, message: Message, now: float) -> list[Action]:
        if message.kind == Kind.REGISTERED:
            log.info("registered with %s", message.body["server"])
            self.name_refused_since = None
            self.registered = True
            self.holding_since = None  # (the broker's heartbeats say which sessions it keeps)
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
        if isinstance(error, BrokerPassive):  # the other broker of the pair serves
            log.info("the broker at %s is passive; connecting%s", self.broker,
                     self._turn_to_next_broker())
            self.last_heard = now
            return self._connect()
        if error.details.get("reason") == "not_registered":
            log.warning("the broker does not know this worker (it restarted?): registering")
            self.registered = False
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
