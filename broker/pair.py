"""The broker pair's state machine (the ZeroMQ guide's Binary Star), sans I/O.

Rule: whether this broker serves is decided here and nowhere else, from three kinds of input:
the peer's state heartbeats (``on_peer``), a client's or worker's knock (``on_request``: a
HELLO, a DEVICES listing or a REGISTER; never a routed data message) and the clock passed in.
No sockets, no clock of its own; the I/O loop (``broker.server``) publishes ``beat()`` and
feeds what it hears.

States: a broker starts PRIMARY or BACKUP (its configured role) and becomes ACTIVE (serves)
or PASSIVE (refuses, telling the peer to try the other broker). The guide's rules, with three
changes that keep "never two actives while they hear each other" true where the guide aborts:

- the backup takes over (PASSIVE -> ACTIVE) only when the primary has been silent past the
  liveness bound *and* a client or worker has come to it: a cut link between the brokers
  alone, with nobody knocking, changes nothing (the guide's split-brain guard);
- each takeover raises a *term* (one past the highest this broker has heard); two actives
  that hear each other (a primary stopped with SIGSTOP and resumed after the backup took
  over) compare terms, and the older one steps down to PASSIVE (equal terms: the backup), so
  exactly one goes on serving; two passives that hear each other make the primary active;
- a freshly started primary serves a knock only once it has heard the backup (it then
  becomes ACTIVE or PASSIVE) or nothing from it for the liveness bound, so a primary
  restarted while the backup serves never serves beside it.

A BACKUP that has never heard its primary refuses every knock, as in the guide: a backup
alone never serves (start the primary).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from fabric.core.errors import BrokerPassive, ConfigError
from fabric.core.flow import DEFAULT_PAIR_HEARTBEAT, DEFAULT_PAIR_LIVENESS


class State(str, enum.Enum):
    """Where one broker of the pair is."""

    PRIMARY = "primary"  # started as primary, waiting to hear the backup
    BACKUP = "backup"  # started as backup, waiting to hear the primary
    ACTIVE = "active"  # serves clients and workers
    PASSIVE = "passive"  # refuses them: the other broker serves


class Event(enum.Enum):
    """What happens to one broker: the peer's state heard, or a knock."""

    PEER_PRIMARY = "primary"
    PEER_BACKUP = "backup"
    PEER_ACTIVE = "active"
    PEER_PASSIVE = "passive"
    CLIENT_REQUEST = "client_request"


@dataclass(frozen=True)
class PairSettings:
    """A broker's place in a pair: the other broker's state address (``peer``), its own
    (``address``), its role, and the state heartbeats' interval and liveness."""

    peer: str
    address: str
    primary: bool
    heartbeat: float = DEFAULT_PAIR_HEARTBEAT
    liveness: int = DEFAULT_PAIR_LIVENESS


@dataclass(frozen=True)
class Beat:
    """A state heartbeat: what one broker says of itself to the other."""

    state: State
    term: int  # raised by each takeover: the newer active wins
    primary: bool  # its configured role

    def to_wire(self) -> dict[str, Any]:
        """The msgpack body of a state heartbeat."""
        return {"state": self.state.value, "term": self.term, "primary": self.primary}

    @classmethod
    def from_wire(cls, body: Any) -> "Beat | None":
        """The beat a body says, or None for anything else (a peer's bytes, bounded by the
        socket, are never trusted to be well formed)."""
        if not isinstance(body, dict):
            return None
        state, term, primary = body.get("state"), body.get("term"), body.get("primary")
        if (state not in {s.value for s in State} or type(term) is not int or term < 0
                or term > 2**62 or type(primary) is not bool):
            return None
        return cls(State(state), term, primary)


@dataclass(frozen=True)
class Change:
    """A transition made: from ``before`` to ``after``, and why (for the log)."""

    before: State
    after: State
    why: str

    @property
    def stepped_down(self) -> bool:
        """ACTIVE -> PASSIVE: the broker must let go of its sessions and workers."""
        return self.before is State.ACTIVE and self.after is State.PASSIVE


class Pair:
    """One broker's side of the pair: its state, its term, and when the peer expires.

    ``primary``: the configured role. ``heartbeat``: seconds between state heartbeats;
    ``liveness``: heartbeats the peer may miss before it counts as gone."""

    def __init__(self, *, primary: bool, heartbeat: float, liveness: int, now: float) -> None:
        self.primary = primary
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.state = State.PRIMARY if primary else State.BACKUP
        self.term = 0
        self.peer_term = 0  # the highest term heard from the peer
        self.peer_state: State | None = None  # what the peer last said (None: never heard)
        self.peer_expiry = now + self.bound  # past it, the peer counts as gone
        self.takeovers = 0  # times this broker became active on a knock (the peer gone)
        self.takeover_wait: float | None = None  # the peer's silence before the last takeover
        self.changed_at = now
        self.why = "started"  # why the state last changed (for the log)

    @property
    def bound(self) -> float:
        """Seconds of silence after which the peer counts as gone."""
        return self.heartbeat * self.liveness

    @property
    def serving(self) -> bool:
        """Whether this broker takes clients and workers now."""
        return self.state is State.ACTIVE

    def beat(self) -> Beat:
        """What to publish now."""
        return Beat(self.state, self.term, self.primary)

    def peer_silent_for(self, now: float) -> float:
        """Seconds since the peer was last heard (approximately: from its expiry)."""
        return max(0.0, now - (self.peer_expiry - self.bound))

    def on_peer(self, beat: Beat, now: float) -> Change | None:
        """The peer's state heartbeat: the transition it causes, if any.

        Raises ConfigError when the peer has this broker's own role (both primary, or both
        backup): the pair cannot decide which serves."""
        if beat.primary == self.primary:
            role = "--primary" if self.primary else "--backup"
            raise ConfigError(
                f"The peer broker was also started with {role}: start one broker of the pair "
                "with --primary and the other with --backup.")
        self.peer_expiry = now + self.bound
        self.peer_state = beat.state
        self.peer_term = max(self.peer_term, beat.term)
        return self._move(Event(beat.state.value), now, beat)

    def on_request(self, now: float) -> bool:
        """A client or worker knocks (HELLO, DEVICES, REGISTER): whether to serve it. False
        means refuse it, telling it to try the other broker (``refusal``)."""
        self._move(Event.CLIENT_REQUEST, now, None)
        return self.serving

    def _move(self, event: Event, now: float, beat: Beat | None) -> Change | None:
        after = self._next(event, now, beat)
        if after is None or after is self.state:
            return None
        change = Change(self.state, after, _why(self.state, event, after))
        if after is State.ACTIVE:
            self.term = max(self.term, self.peer_term) + 1
            if event is Event.CLIENT_REQUEST and self.state is State.PASSIVE:
                self.takeovers += 1
                self.takeover_wait = self.peer_silent_for(now)
        self.state, self.changed_at, self.why = after, now, change.why
        return change

    def _next(self, event: Event, now: float, beat: Beat | None) -> State | None:
        """The guide's table, with this module's three changes (see its rule)."""
        state, peer_gone = self.state, now >= self.peer_expiry
        if event is Event.CLIENT_REQUEST:
            if state in (State.PRIMARY, State.PASSIVE) and peer_gone:
                return State.ACTIVE
            return None
        if state is State.PRIMARY:
            return {Event.PEER_BACKUP: State.ACTIVE,
                    Event.PEER_ACTIVE: State.PASSIVE}.get(event)
        if state is State.BACKUP:
            return State.PASSIVE if event is Event.PEER_ACTIVE else None
        if state is State.ACTIVE:
            assert beat is not None
            if event is Event.PEER_ACTIVE and (beat.term, beat.primary) > (self.term,
                                                                          self.primary):
                return State.PASSIVE  # the newer active serves
            return None
        # PASSIVE: the peer restarting (it will go passive when it hears this one active),
        # or two passives (the primary serves).
        if event in (Event.PEER_PRIMARY, Event.PEER_BACKUP):
            return State.ACTIVE
        if event is Event.PEER_PASSIVE and self.primary:
            return State.ACTIVE
        return None


def refusal(pair: Pair, what: str) -> BrokerPassive:
    """The typed refusal of a knock (``what``: "session", "device list", "registration") by a
    broker that does not serve now."""
    return BrokerPassive(
        f"This broker is the {pair.state.value} one of a pair and does not serve now: the "
        "other broker does, or takes over within the pair's liveness bound. Try the other "
        "broker (list both: the connection file's brokers, or fabric worker --broker A,B).",
        state=pair.state.value, refused=what)


def _why(before: State, event: Event, after: State) -> str:
    if event is Event.CLIENT_REQUEST:
        return ("the peer was silent past the liveness bound and a client or worker came"
                if before is State.PASSIVE else
                "the peer was not heard since this broker started, and a client or worker came")
    return f"the peer says it is {event.value}"
