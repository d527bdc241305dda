"""The broker's session registry, sans I/O: every event in, the messages it causes out.

Rule: this is where an event meets the rooms it touches. The I/O loop (``broker.server``)
feeds this object frames, "unroutable" events and the clock, and sends the ``Send`` items it
returns; nothing here touches a socket or reads the clock. The rooms keep their own rules:
admission checks in ``broker.handshake`` (ZAP's answers in ``broker.zap_gate``), session phases
and indexes in ``broker.sessions``, sessions the broker ends itself in ``broker.endings``,
workers, lanes and device numbers in ``broker.worker_table``, admin commands in
``broker.admin_service``, answers to oversized messages in ``broker.sizes``, the records in
``broker.model``; the loop's flow control in ``broker.backpressure``.

Data messages are routed by the header alone (a header unpack and a dict lookup), their
body and buffers handed on as the frames that arrived. Traffic is counted per session there
(messages, bytes, SUBMITs) and folded into per-device totals when a session ends.

Message sizes: each peer says the largest frame its socket takes (``max_message_bytes`` in
HELLO and REGISTER); the broker tells each side what it may send towards the other (WELCOME
for uploads, OPEN for replies, REGISTERED for transfers), so that an oversized array is
refused with ``MessageTooLarge`` by its sender instead of a silent disconnect; a message
with more frames or bytes in all than fabric ever sends is refused too (``fabric.core.flow``).
Heartbeats to a worker list the sessions the broker holds on it (to a lane, its device's),
and the worker closes any other: a lost CLOSE cannot leak a session's memory.

Liveness: busy is not dead. A worker is lost when its link is: a heartbeat (or any send) to
its own socket, a lane or its beacon is unroutable. The beacon is a socket of the worker that
carries only libzmq's ZMTP heartbeats, sent from libzmq's I/O thread without the GIL, each
asking this end's libzmq to close the connection after ``heartbeat * liveness`` seconds
without another (``workers.control``); so libzmq closes it when the worker's process ends (at
once) and when the worker is stopped or cut off (after that bound). Every heartbeat round
asks each beacon, and so does a probe as soon as the I/O loop's monitor says a connection on
the workers' port closed. A worker whose Python says nothing for a while (a device holding
the GIL, a process starved of a core) is waited for. A client is gone when a PING to it is
unroutable: a client is asked soon after its connection closes (the I/O loop's monitor and
intake say whose it was), and an idle session's client once a lease.

A refused token (client, admin or worker) is counted and its answer held ``Limits.auth_delay``
by the I/O loop: this object never sleeps and the loop never blocks. What a peer can make the
broker log at will (refusals, bad messages) goes through ``broker.log_limit``: one line per
kind per interval, flushed by ``tick``. Session and connection ids are logged at DEBUG only.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from fabric.core import protocol
from fabric.core.errors import AuthenticationError, FabricError, ProtocolError, SessionLost
from fabric.core.flow import MAX_MESSAGE_FRAMES, message_bytes_limit
from fabric.core.protocol import (
    CLIENT_DATA_KINDS,
    PROTOCOL_VERSION,
    Header,
    Kind,
    Message,
)

from fabric.core.resume import digest

from . import admin_service, link_grants, resume
from .endings import Endings
from .handshake import (
    hello_refusal,
    misplaced,
    other_version,
    size_limit,
    token_index,
    token_ok,
    version_mismatch,
)
from .model import (
    Limits,
    Send,
    Session,
    SessionPhase,
    Side,
    Traffic,
    Worker,
    new_send,
    send_error,
    send_message,
)
from .pair import Pair, refusal
from .sessions import SessionEvent, SessionTable
from .sizes import frames_size as _frames_size, message_too_large
from .worker_messages import WorkerMessages
from .worker_table import WorkerTable
from .zap_gate import ZapGate
from fabric.core.log_limit import RateLimitedLog

log = logging.getLogger("fabric.broker")

_OPEN, _OPENING = SessionPhase.OPEN, SessionPhase.OPENING


class Registry(WorkerMessages):
    """Sessions, workers and devices of one broker, driven by events and the clock (what
    workers send: ``broker.worker_messages``)."""

    def __init__(
        self,
        *,
        client_token: str | Sequence[str],
        worker_token: str,
        admin_token: str | None = None,
        server: str = "fabric-broker",
        limits: Limits = Limits(),
        now: float = 0.0,
        curve_keys: Mapping[str, frozenset[bytes]] | None = None,
        endpoints: dict[str, str] | None = None,
    ) -> None:
        # One client token, or several (one per user or team; each has its session cap).
        tokens = [client_token] if isinstance(client_token, str) else list(client_token)
        self._client_tokens = [token.encode() for token in tokens]
        # Whose a session is, as its worker keeps it for a takeover (``broker.resume``)
        self._owners = [digest(token) for token in self._client_tokens]
        self._sessions_per_token = limits.sessions_per_token(len(tokens))
        self._worker_token = worker_token.encode()
        self._admin_token = admin_token.encode() if admin_token else None
        self.server = server
        self.endpoints = dict(endpoints or {})  # the bound addresses, named to misplaced peers
        self.limits = limits
        self._message_bytes = message_bytes_limit(limits.max_message_bytes)  # in all frames
        self.started = now
        self.sessions: dict[int, Session] = {}
        self.worker_table = WorkerTable()  # (the numbering: admin forgets, the loop saves it)
        self._sessions = SessionTable(self.sessions, self.worker_table, limits)
        # The hot path's lookups, bound once (the tables never rebind them).
        self.workers: dict[bytes, Worker] = self.worker_table.workers
        self._lane_owner = self.worker_table.lane_owner
        self._find_worker = self.worker_table.find
        self._next_heartbeat = now
        self._next_scan = now
        # A connection on the workers' port closed: each worker's beacon is asked then
        # (``connection_closed``), at most once a scan interval.
        self._next_probe = float("inf")
        self._probed = float("-inf")
        self.counters: Counter[str] = Counter()
        self.rejects: Counter[str] = Counter()
        self.stopping = False  # set by the admin ``shutdown``: the I/O loop stops
        # The I/O loop's flow-control figures, for the admin ``status`` (``broker.backpressure``).
        self.queue_figures: Callable[[], dict[str, Any]] = dict
        self._endings = Endings(self._sessions, self.worker_table, self.counters, self.rejects,
                                limits, lambda *line: self._log_peer(*line))
        self._log_limit = RateLimitedLog()  # what peers can make the broker log, per interval
        # With a peer broker (``broker.pair``): whether this one serves new sessions, device
        # lists and registrations. Asked only at those knocks, never per routed message.
        self.pair: Pair | None = None
        self.reload_numbering: Callable[[], None] | None = None  # the I/O loop's state file
        self.settling = resume.Settling()  # after a takeover, until the workers are back
        # Who may finish the ZeroMQ handshake: a token of any role, or with CURVE
        # (``curve_keys``, per ZAP domain) an allowed key. The I/O loop feeds it ZAP requests.
        self.zap = ZapGate({"client": self._client_tokens, "worker": [self._worker_token],
                            "admin": [self._admin_token] if self._admin_token else []},
                           curve_keys, self.rejects, self._log_peer, self._token_refused)

    # -- what the rooms hold, for admin views and tests ---------------------------------------

    @property
    def devices(self) -> list[dict[str, Any]]:
        """The online devices, by global index."""
        return self.worker_table.devices

    @property
    def device_count(self) -> int:
        """Global device indexes in use, online or not."""
        return self.worker_table.device_count

    @property
    def device_slots(self) -> dict[int, tuple[str, int]]:
        """Global index -> (worker name, local index), online or not (forgotten: absent)."""
        return self.worker_table.device_slots

    @property
    def retired(self) -> dict[tuple[str, int], Traffic]:
        """The traffic of ended sessions per device (worker name, local index)."""
        return self.worker_table.retired

    @property
    def client_sessions(self) -> dict[bytes, set[int]]:
        """Each client identity's sessions."""
        return self._sessions.by_client

    def last_seen(self, session: Session) -> float:
        """When a session's client was last heard from: its own traffic, or a PING on its
        connection."""
        return self._sessions.last_seen(session)

    def device_of(self, session: Session) -> dict[str, Any]:
        """The description of the device a session is on."""
        return self.worker_table.info(session.device)

    # -- answers -----------------------------------------------------------------------------

    def _log_peer(self, level: int, kind: str, identity: bytes | str, now: float,
                  detail: str = "") -> None:
        """Log a line a peer can cause at will through the rate limit (``broker.log_limit``)."""
        line = self._log_limit.note(level, kind, identity, now, detail)
        if line is not None:
            log.log(*line)

    def _reject(self, identity: bytes, header: Header, error: FabricError,
                now: float) -> list[Send]:
        self.rejects[error.code] += 1
        self._log_peer(logging.INFO, f"rejected handshake ({error.code})", identity, now)
        return [send_error(Side.FRONTEND, identity, error, kind=Kind.REJECT,
                           session=header.session, request=header.request)]

    def _passive(self, now: float) -> bool:
        """A knock (HELLO, DEVICES, REGISTER): whether this broker refuses it because the
        other broker of its pair serves (``broker.pair``)."""
        if self.pair is None:
            return False
        was_serving = self.pair.serving
        if not self.pair.on_request(now):
            return True
        if not was_serving:
            self.began_serving(now)
        return False

    def began_serving(self, now: float) -> None:
        """This broker of a pair began serving. With no worker registered yet it takes the
        device numbering again from the state file the pair shares (the other broker kept it
        while serving), so that devices keep their indexes across a takeover, and settles:
        clients wait until that table's workers have registered (``broker.resume``)."""
        if self.workers:
            return
        if self.reload_numbering is not None:
            self.reload_numbering()
        self.settling.begin({name for name, _ in self.device_slots.values()}, now,
                            self.limits.settle_time)

    def _settled(self, identity: bytes, header: Header, now: float) -> list[Send] | None:
        """The refusal of a client's HELLO or DEVICES while this broker settles, or None."""
        if not self.settling.active(now):
            return None
        return self._refuse_settling(identity, header, now)

    def _refuse_settling(self, identity: bytes, header: Header, now: float) -> list[Send]:
        """Refuse a client's request while this broker settles: it retries."""
        return self._reject(identity, header, self.settling.mark(resume.settling_refusal()),
                            now)

    def _token_refused(self, sends: list[Send], now: float) -> list[Send]:
        """The answer to a refused token, held back ``auth_delay`` by the I/O loop (it never
        sleeps here) so guessing costs time; counted with the reason already recorded."""
        self.counters["tokens_refused"] += 1
        return [send._replace(not_before=now + self.limits.auth_delay) for send in sends]

    def _bad_input(self, side: Side, identity: bytes, error: FabricError, now: float,
                   header: Header | None = None) -> list[Send]:
        self.counters[f"{side.value}_protocol_errors"] += 1
        self._log_peer(logging.WARNING, f"bad message on the {side.value} socket", identity, now,
                       str(error))
        session, request = (header.session, header.request) if header else (0, 0)
        return [send_error(side, identity, error, session=session, request=request)]

    def _oversized(self, frames: Sequence[Any]) -> bool:
        return len(frames) > MAX_MESSAGE_FRAMES or _frames_size(frames) > self._message_bytes

    def _too_large(self, side: Side, identity: bytes, header: Header, frames: Sequence[Any],
                   now: float) -> list[Send]:
        self.counters["messages_too_large"] += 1
        self._log_peer(logging.WARNING, f"message too large on the {side.value} socket",
                       identity, now)
        return message_too_large(side, identity, header, frames, _frames_size(frames),
                                 self._message_bytes)

    def _other_version(self, side: Side, identity: bytes, message: Message,
                       now: float) -> list[Send]:
        return self._bad_input(side, identity, other_version(side, message), now,
                               message.header)

    # -- clients -----------------------------------------------------------------------

    def from_client(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """A message from the frontend (routing identity already split off)."""
        header = None  # once read, an error answer names the request it answers
        try:
            if not frames:
                raise ProtocolError("A message needs a header frame.")
            header = protocol.decode_header(frames[0])
            if len(frames) > 2 and self._oversized(frames):  # (two are within MAXMSGSIZE)
                return self._too_large(Side.FRONTEND, identity, header, frames, now)
            if header.kind in CLIENT_DATA_KINDS and header.version == PROTOCOL_VERSION:
                protocol.check_frames(header, frames)
                return self._route_client_data(identity, header, frames, now)
            if header.kind == Kind.HELLO and header.version != PROTOCOL_VERSION:
                # Checked before the body: another version may lay out its body differently.
                return self._reject(identity, header,
                                    version_mismatch("client", header.version), now)
            message = protocol.decode(frames, header)
        except ProtocolError as exc:
            return self._bad_input(Side.FRONTEND, identity, exc, now, header)
        if message.version != PROTOCOL_VERSION:
            return self._other_version(Side.FRONTEND, identity, message, now)
        handler = self._client_handlers.get(message.kind)
        if handler is None:
            return self._bad_input(Side.FRONTEND, identity, misplaced(  # (WrongPort to a worker)
                Side.FRONTEND, message.kind, self.endpoints), now, header)
        return handler(self, identity, message, now)

    def _route_client_data(self, identity: bytes, header: Header, frames: Sequence[Any],
                           now: float) -> list[Send]:
        session = self.sessions.get(header.session)
        if session is None or session.client != identity or session.phase is not _OPEN:
            self.counters["unknown_session"] += 1
            return [send_error(Side.FRONTEND, identity, SessionLost(
                f"Session {header.session:#x} is not open on this broker: open a new session.",
                session=header.session), session=header.session, request=header.request)]
        session.last_seen = now
        session.messages_in += 1
        session.bytes_in += _frames_size(frames)
        if header.kind is Kind.SUBMIT or header.flags & protocol.CARRIES_BATCH:  # (batches)
            session.submits += 1
        return [new_send(Send, (Side.WORKERS, session.lane, list(frames), 0.0))]

    def _client_token_refused(self, identity: bytes, header: Header,
                              now: float) -> list[Send]:
        return self._token_refused(self._reject(identity, header, AuthenticationError(
            "The broker refused the token: check the client token you were given."), now),
            now)

    def _on_hello(self, identity: bytes, message: Message, now: float) -> list[Send]:
        body = message.body
        token = token_index(body["token"], self._client_tokens)
        if token is None:
            return self._client_token_refused(identity, message.header, now)
        if self._passive(now):
            return self._reject(identity, message.header, refusal(self.pair, "session"), now)
        settling = self._settled(identity, message.header, now)
        if settling is not None:
            return settling
        refused = hello_refusal(identity, token, message, self.worker_table, self._sessions,
                                self.limits, self._sessions_per_token)
        if refused is not None:
            return self._reject(identity, message.header, refused, now)
        device = body["device"]
        owner, local = self.worker_table.owner(device)
        worker = self.workers[owner]
        session = Session(
            id=message.session, client=identity, device=device, local=local, worker=owner,
            lane=worker.lane(local), phase=_OPENING, created=now, last_seen=now,
            hello_request=message.request, token=token,
            client_max=size_limit(body, self.limits.max_message_bytes))
        self._sessions.open(session, worker, now)
        self.counters["hellos"] += 1
        return [send_message(Side.WORKERS, session.lane, Message(
            Kind.OPEN, message.session, message.request,
            {"device": local, "client": str(body.get("client", "")),
             "max_message_bytes": session.client_max, "owner": self._owners[token]}))]

    def _on_devices(self, identity: bytes, message: Message, now: float) -> list[Send]:
        if token_index(message.body["token"], self._client_tokens) is None:
            return self._client_token_refused(identity, message.header, now)
        if self._passive(now):
            return self._reject(identity, message.header, refusal(self.pair, "device list"),
                                now)
        settling = self._settled(identity, message.header, now)
        if settling is not None:
            return settling
        return [send_message(Side.FRONTEND, identity, Message(
            Kind.DEVICE_LIST, 0, message.request,
            {"devices": self.devices, "server": self.server}))]

    def _on_close(self, identity: bytes, message: Message, now: float) -> list[Send]:
        session = self.sessions.get(message.session)
        if session is None or session.client != identity:
            return [send_error(Side.FRONTEND, identity, SessionLost(
                f"Session {message.session:#x} is not open on this broker.",
                session=message.session), session=message.session, request=message.request)]
        session.last_seen = now
        session.close_request = message.request  # the CLOSED answers this request
        if self._sessions.move(session, SessionEvent.CLOSE, now) is _OPENING:
            # The client gave up on its handshake: answered at once, and closed on the
            # worker too, which may still open it.
            return [self._endings.close_on_worker(session), self._endings.closed(session)]
        return [self._endings.close_on_worker(session, message.request)]

    def _on_ping(self, identity: bytes, message: Message, now: float) -> list[Send]:
        self._sessions.heard_from_client(identity, now)  # constant time, however many sessions
        return [send_message(Side.FRONTEND, identity, Message(
            Kind.PONG, message.session, message.request))]

    def _on_admin(self, identity: bytes, message: Message, now: float) -> list[Send]:
        if not token_ok(message.body["token"], self._admin_token):
            self.rejects["admin_unauthorized"] += 1
            self._log_peer(logging.WARNING, "refused an admin command (not the admin token)",
                           identity, now)
            return self._token_refused([send_error(Side.FRONTEND, identity, AuthenticationError(
                "The broker refused the token: admin commands need the admin token "
                "(FABRIC_ADMIN_TOKEN, or the admin_token of the connection file)."),
                kind=Kind.REJECT, request=message.request)], now)
        return admin_service.answer(self, identity, message, now)

    _client_handlers = {
        Kind.HELLO: _on_hello,
        Kind.DEVICES: _on_devices,
        Kind.CLOSE: _on_close,
        Kind.PING: _on_ping,
        Kind.ADMIN: _on_admin,
        Kind.LINK: link_grants.grant_to_client,
        Kind.RESUME: resume.on_resume,
    }

    # -- sessions the broker ends (``broker.endings``); peers that vanish ----------------------

    def unroutable(self, side: Side, identity: bytes, now: float) -> list[Send]:
        """The I/O loop could not deliver to this peer: it has disconnected."""
        if side == Side.WORKERS:
            worker = self._find_worker(identity) or self.workers.get(
                self.worker_table.beacon_owner.get(identity))
            return self._endings.lose_worker(worker, (
                "disconnected (its process ended, or its link was silent for "
                f"{self.limits.heartbeat * self.limits.liveness:g} s)")) if worker else []
        return self._endings.lose_client(identity, "the client disconnected", now,
                                         resumable=self.pair is not None)

    def connection_cut(self, side: Side, peer: str, held: int, limit: int, now: float) -> None:
        """The I/O loop cut a connection on ``side`` that held ``held`` bytes unread, past
        ``limit`` (a message in progress bigger than any fabric peer sends:
        ``fabric.core.intake``); counted, and logged through the rate limit. Its peer's sessions
        end as a vanished client's do, when the loop finds it unroutable."""
        self.counters["connections_cut"] += 1
        self._log_peer(logging.WARNING, f"a connection on the {side.value} socket held more "
                       f"than {limit} bytes unread (a message bigger than fabric sends): cut",
                       peer, now, f"{held} bytes held")

    def cut_client(self, identity: bytes, queued: int, now: float | None = None) -> list[Send]:
        """End every session of a client that left ``queued`` messages unread (see
        ``Endings.cut_client``; said through the rate limit at ``now``, if given); nothing
        when it has none left."""
        return self._endings.cut_client(identity, queued, now)

    def worker_name(self, identity: bytes) -> str:
        """The name of the worker that owns a routing identity (its socket or a lane), for
        log lines, which show no connection ids above DEBUG."""
        worker = self._find_worker(identity)
        return worker.name if worker is not None else "(unregistered)"

    def lose_worker(self, identity: bytes, why: str) -> list[Send]:
        """Declare a worker lost for the I/O loop (say, it took nothing sent to it for too
        long): its clients are told, as when it dies."""
        worker = self._find_worker(identity)
        return self._endings.lose_worker(worker, why) if worker is not None else []

    # -- the clock -------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When ``tick`` next has work to do: the next heartbeat, or the next scan of
        deadlines (four per heartbeat interval, so no message pays for a scan), a probe of
        the workers after a connection closed, or a client to ask after its own closed."""
        return min(self._next_heartbeat, self._next_scan, self._next_probe,
                   self._sessions.next_ask)

    def connection_closed(self, now: float) -> None:
        """A connection on the workers' port closed (the I/O loop's socket monitor says so,
        not whose): the next ``tick`` asks each worker's beacon, so that a worker whose link
        it was is found unroutable then, not a heartbeat later. At most once a scan interval,
        however many connections close."""
        self._next_probe = min(self._next_probe,
                               max(now, self._probed + self.limits.heartbeat / 4))

    def client_connection_closed(self, identity: bytes, now: float) -> None:
        """A connection of client ``identity`` closed (its process ended, its link broke): a
        scan interval later, if it holds sessions, it is asked whether it is still there (a
        PING, unroutable to a client that is gone, whose sessions then end), so that they end
        within a heartbeat, not a lease later. Asked, not ended: it may have connected again
        under its routing id. (Not at once: libzmq may still be removing the connection from
        the socket, and a PING into it would be taken.)"""
        self._sessions.ask_later(identity, now + self.limits.heartbeat / 4)

    def _heartbeat(self, identity: bytes, sessions: Any) -> Send:
        return send_message(Side.WORKERS, identity, Message(
            Kind.HEARTBEAT, body={"sessions": sorted(sessions)}))

    def _ask_beacons(self) -> list[Send]:
        """A HEARTBEAT to each worker's beacon: unroutable, its link is gone (the worker
        reads and drops it)."""
        return [send_message(Side.WORKERS, worker.beacon, Message(Kind.HEARTBEAT))
                for worker in self.workers.values() if worker.beacon]

    def tick(self, now: float) -> list[Send]:
        """Heartbeats, lost workers, handshake and close deadlines, idle-client probes, and
        the summaries of repeated log lines."""
        for line in self._log_limit.due(now):
            log.log(*line)
        sends: list[Send] = []
        limits = self.limits
        self._next_scan = now + limits.heartbeat / 4
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + limits.heartbeat
            self._next_probe, self._probed = float("inf"), now  # (this asks every worker)
            # Each lists the sessions here: the worker closes any other (a lost CLOSE).
            for worker in self.workers.values():
                sends.append(self._heartbeat(worker.identity, worker.sessions))
                for local, lane in enumerate(worker.lanes if worker.ready else ()):
                    sends.append(self._heartbeat(lane, [
                        s for s in worker.sessions if self.sessions[s].local == local]))
            sends += self._ask_beacons()
        elif now >= self._next_probe:
            self._next_probe, self._probed = float("inf"), now
            sends += self._ask_beacons()
        if now >= self._sessions.next_ask:  # (an unroutable PING: the client has gone)
            sends += [send_message(Side.FRONTEND, client, Message(Kind.PING, session))
                      for client, session in self._sessions.to_ask(now)]
        # A worker is never lost for saying nothing: busy is not dead. It is lost when its
        # link is gone (a send to it is unroutable): closed by its end, or by libzmq when its
        # beacon's ZMTP heartbeats stopped for heartbeat x liveness (see the module's rule).
        for session in list(self.sessions.values()):
            if now > session.deadline:
                sends += self._endings.expire(session, now)
            elif (session.client and now - self._sessions.last_seen(session) > limits.lease
                  and now - session.probed > limits.lease):
                # An unroutable PING tells the loop the client has gone (ROUTER_MANDATORY).
                session.probed = now
                sends.append(send_message(Side.FRONTEND, session.client,
                                          Message(Kind.PING, session.id)))
        return sends

    # -- administration (the commands are in broker.admin_service) ----------------------

    def close_session(self, session_id: int) -> list[Send]:
        """End a session for an administrator: closed on its worker, its client told.

        Raises NotFound, changing nothing, when the broker has no such session.
        """
        return self._endings.close_by_admin(session_id)

    def worker_named(self, name: str) -> Worker:
        """The connected worker called ``name``; NotFound when there is none."""
        return self.worker_table.named(name)

    def drain(self, name: str, draining: bool = True) -> Worker:
        """Stop (or, with ``draining=False``, resume) new sessions on a worker's devices.

        Existing sessions go on. Raises NotFound, changing nothing, for an unknown worker.
        """
        worker = self.worker_table.drain(name, draining)
        log.info("worker %s %s by an administrator", name,
                 "drained" if draining else "undrained")
        return worker

    def shutdown(self) -> list[Send]:
        """Tell every client its session ends because the broker stops."""
        return self._endings.shutdown()

    def step_down(self) -> list[Send]:
        """This broker went passive under the other of its pair (``broker.pair``): every
        worker is told to go to the other (a refusal, as its REGISTER would get now) and
        forgotten, and each session's client is told its session is lost."""
        assert self.pair is not None
        sends: list[Send] = []
        for worker in list(self.workers.values()):
            sends.append(send_error(Side.WORKERS, worker.identity,
                                    refusal(self.pair, "registration"), kind=Kind.REJECT))
            sends += self._endings.lose_worker(
                worker, "was let go: this broker stepped down, the other of its pair serves")
        return sends
