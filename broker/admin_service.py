"""The broker's admin commands, sans I/O: what ``fabric admin`` and ``fabric.Admin`` ask for.

Rule: every command is a function of the registry and the clock that returns a plain,
msgpack-able dict (and the messages the registry must send, for commands that change
something); nothing here touches a socket or reads the clock. Read-only commands change
nothing; a command that names a missing session or worker raises ``NotFound`` before it
changes anything. No result ever holds a token.

Traffic figures are what the broker sees without decoding data bodies: data messages and
bytes both ways, ``submits`` (batches of ops: SUBMITs, and requests whose header says they
carry one; the op count itself is in the body, which the broker never reads) and ``errors`` (ERROR
messages from the worker about a session; op errors reported inside a REPLY body are not visible
here). Times are ages in seconds, measured on the broker's monotonic clock.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Protocol

from fabric.core.errors import FabricError, ProtocolError
from fabric.core.log_limit import peer_label
from fabric.core.protocol import MAX_ID, PROTOCOL_VERSION, Kind, LinkReport, Message

from .model import Send, Session, Side, Traffic, Worker, send_error, send_message
from .model import reported  # (what workers report of their devices)
from .pair import Pair
from .worker_table import WorkerTable

log = logging.getLogger("fabric.broker")

Result = tuple[dict[str, Any], list[Send]]


class RegistryView(Protocol):
    """What the admin commands read and change of ``broker.registry.Registry`` (declared
    here so that the registry, which runs the commands, and they import no circle)."""

    server: str
    started: float
    stopping: bool
    sessions: dict[int, Session]
    workers: dict[bytes, Worker]
    counters: Counter[str]
    rejects: Counter[str]
    queue_figures: Callable[[], dict[str, Any]]
    worker_table: WorkerTable
    pair: Pair | None

    @property
    def devices(self) -> list[dict[str, Any]]: ...

    @property
    def device_count(self) -> int: ...

    @property
    def device_slots(self) -> dict[int, tuple[str, int]]: ...

    @property
    def retired(self) -> dict[tuple[str, int], Traffic]: ...

    def last_seen(self, session: Session) -> float: ...

    def close_session(self, session_id: int) -> list[Send]: ...

    def drain(self, name: str, draining: bool = True) -> Worker: ...


def _traffic(total: Traffic) -> dict[str, int]:
    return {"messages": total.messages, "bytes": total.bytes, "submits": total.submits,
            "errors": total.errors}


def device_traffic(registry: RegistryView) -> dict[tuple[str, int], Traffic]:
    """Totals per device (worker name, local index): ended sessions plus the open ones."""
    totals: dict[tuple[str, int], Traffic] = {}
    for key, retired in registry.retired.items():
        totals.setdefault(key, Traffic()).add(retired)
    for session in registry.sessions.values():
        key = (registry.workers[session.worker].name, session.local)
        totals.setdefault(key, Traffic()).add(session)
    return totals


def status(registry: RegistryView, now: float) -> dict[str, Any]:
    """The broker at a glance: identity, uptime, peers, traffic and its rates, rejections."""
    uptime = max(now - registry.started, 0.0)
    total = Traffic()
    for traffic in device_traffic(registry).values():
        total.add(traffic)
    states: dict[str, int] = {}
    for session in registry.sessions.values():
        states[session.phase.value] = states.get(session.phase.value, 0) + 1
    return {
        "server": registry.server,
        "protocol_version": PROTOCOL_VERSION,
        "uptime": uptime,
        "workers": len(registry.workers),
        "workers_draining": sorted(w.name for w in registry.workers.values() if w.draining),
        "devices_online": len(registry.devices),
        "devices_total": registry.device_count,
        "sessions": len(registry.sessions),
        "sessions_by_state": states,
        "sessions_ended": total.sessions,
        "traffic": _traffic(total),
        "rates": {"messages_per_s": total.messages / uptime if uptime else 0.0,
                  "bytes_per_s": total.bytes / uptime if uptime else 0.0},
        "rejects": dict(registry.rejects),
        "protocol_errors": {"frontend": registry.counters["frontend_protocol_errors"],
                            "workers": registry.counters["workers_protocol_errors"]},
        "counters": dict(registry.counters),
        # Flow control now (kept by the I/O loop): messages parked for peers whose queue is
        # full, and whether the frontend is paused for a worker that is not reading.
        "queues": {"parked_messages": 0, "parked_bytes": 0, "peers_waiting": 0,
                   "frontend_paused": False, **registry.queue_figures()},
        "pair": pair_status(registry.pair, now),
    }


def pair_status(pair: Pair | None, now: float) -> dict[str, Any] | None:
    """This broker's part in a pair (``broker.pair``), or None for a broker without a peer."""
    if pair is None:
        return None
    return {"role": "primary" if pair.primary else "backup", "state": pair.state.value,
            "term": pair.term, "peer_state": pair.peer_state.value if pair.peer_state else None,
            "peer_silent_for": pair.peer_silent_for(now), "takeovers": pair.takeovers,
            "takeover_wait": pair.takeover_wait, "in_state_for": now - pair.changed_at}


def workers(registry: RegistryView, now: float) -> dict[str, Any]:
    """Every connected worker with its host, address, devices, ages, sessions, drain state,
    traffic and what its direct links carried (``link_sent``, ``link_sent_bytes``,
    ``link_received``, ``link_received_bytes``, ``link_fallbacks``: None until it reports);
    and every lost one (offline, its indexes kept) with how long ago it was last
    heard from (None: not since this broker started, its indexes from the state file)."""
    totals = device_traffic(registry)
    rows = []
    for worker in registry.workers.values():
        total = Traffic()
        for local in range(len(worker.devices)):
            total.add(totals.get((worker.name, local), Traffic()))
        indexes = [d["index"] for d in registry.devices if d["worker"] == worker.name]
        rows.append({
            "name": worker.name, "host": worker.host, "address": worker.address,
            "backend": worker.backend, "devices": indexes,
            "registered_ago": now - worker.registered, "last_seen_ago": now - worker.last_seen,
            "sessions": len(worker.sessions), "draining": worker.draining,
            "memory_budget": worker.report and worker.report.budget_bytes,
            "link_refusals": worker.report.link_refusals if worker.report else 0,
            **{f"link_{name}": worker.report and getattr(worker.report.links, name)
               for name in LinkReport._fields},
            **_traffic(total)})
    rows.sort(key=lambda row: row["devices"][:1] or [registry.device_count])
    return {"workers": rows, "lost": lost_workers(registry, now)}


def lost_workers(registry: RegistryView, now: float) -> list[dict[str, Any]]:
    """Every worker gone offline whose device indexes are kept: name, host, address, backend,
    those indexes, and seconds since it was last heard from (None: not since this broker
    started)."""
    online = {worker.name for worker in registry.workers.values()}
    indexes: dict[str, list[int]] = {}
    for index, (name, _) in sorted(registry.device_slots.items()):
        if name not in online:
            indexes.setdefault(name, []).append(index)
    rows = []
    for name, kept in indexes.items():  # (by first index)
        last = registry.worker_table.lost.get(name)
        rows.append({"name": name, "host": last.host if last else "",
                     "address": last.address if last else "",
                     "backend": last.backend if last else None, "devices": kept,
                     "lost_ago": now - last.last_seen if last else None})
    return rows


def devices(registry: RegistryView, now: float) -> dict[str, Any]:
    """Every device index, online or not, with its worker, sessions and traffic."""
    totals = device_traffic(registry)
    by_name = {w.name: w for w in registry.workers.values()}
    online = {d["index"] for d in registry.devices}
    rows = []
    for index, (name, local) in sorted(registry.device_slots.items()):
        worker = by_name.get(name)
        sessions = 0 if worker is None else sum(
            1 for s in worker.sessions if registry.sessions[s].local == local)
        rows.append({
            "index": index, "worker": name, "local": local,
            "backend": worker.backend if worker else None, "online": index in online,
            "draining": bool(worker and worker.draining), "sessions": sessions,
            **_traffic(totals.get((name, local), Traffic())),
            **reported(worker, local)})
    return {"devices": rows}


def sessions(registry: RegistryView, now: float) -> dict[str, Any]:
    """Every session the broker knows, oldest first."""
    rows = []
    for session in sorted(registry.sessions.values(), key=lambda s: (s.created, s.id)):
        rows.append({
            "id": f"{session.id:#018x}", "client": peer_label(session.client),
            "device": session.device, "worker": registry.workers[session.worker].name,
            "state": session.phase.value, "created_ago": now - session.created,
            "last_seen_ago": now - registry.last_seen(session), "messages": session.messages,
            "bytes": session.bytes, "submits": session.submits, "errors": session.errors})
    return {"sessions": rows}


# -- arguments and the command table -----------------------------------------------------------


def _arg(args: dict[str, Any], name: str, kind: type, command: str) -> Any:
    value = args.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"The admin command {command} needs the argument {name!r} "
                            f"({kind.__name__}).", field=name)
    return value


def _session_id(args: dict[str, Any]) -> int:
    session = _arg(args, "session", int, "close-session")
    if not 0 < session <= MAX_ID:
        raise ProtocolError(f"Session id {session} is out of range: ids are 1 to 2**64-1.",
                            field="session")
    return session


def _read_only(view: Callable[[RegistryView, float], dict[str, Any]],
               ) -> Callable[[RegistryView, dict[str, Any], float], Result]:
    return lambda registry, args, now: (view(registry, now), [])


def _ping(registry: RegistryView, args: dict[str, Any], now: float) -> Result:
    return {"server": registry.server, "protocol_version": PROTOCOL_VERSION,
            "uptime": now - registry.started, "pair": pair_status(registry.pair, now)}, []


def _close_session(registry: RegistryView, args: dict[str, Any], now: float) -> Result:
    session = _session_id(args)
    sends = registry.close_session(session)
    return {"session": f"{session:#018x}", "closed": True}, sends


def _set_draining(draining: bool) -> Callable[[RegistryView, dict[str, Any], float], Result]:
    def command(registry: RegistryView, args: dict[str, Any], now: float) -> Result:
        name = _arg(args, "worker", str, "drain" if draining else "undrain")
        worker = registry.drain(name, draining)
        return {"worker": worker.name, "draining": worker.draining,
                "sessions": len(worker.sessions)}, []
    return command


def _forget(registry: RegistryView, args: dict[str, Any], now: float) -> Result:
    name = _arg(args, "worker", str, "forget")
    indexes = registry.worker_table.forget(name)
    log.info("worker %s forgotten by an administrator: device indexes %s are retired",
             name, indexes)
    return {"worker": name, "indexes": indexes}, []


def _shutdown(registry: RegistryView, args: dict[str, Any], now: float) -> Result:
    registry.stopping = True  # the loop sends this reply, then stops and tells the clients
    return {"server": registry.server, "stopping": True,
            "sessions": len(registry.sessions)}, []


COMMANDS: dict[str, Callable[[RegistryView, dict[str, Any], float], Result]] = {
    "ping": _ping,
    "status": _read_only(status),
    "workers": _read_only(workers),
    "devices": _read_only(devices),
    "sessions": _read_only(sessions),
    "close-session": _close_session,
    "drain": _set_draining(True),
    "undrain": _set_draining(False),
    "forget": _forget,
    "shutdown": _shutdown,
}


def run(registry: RegistryView, command: str, args: dict[str, Any], now: float) -> Result:
    """Run one admin command: its result and the messages to send.

    Raises ProtocolError for an unknown command or bad arguments and NotFound for a missing
    session or worker; either way nothing has changed.
    """
    handler = COMMANDS.get(command)
    if handler is None:
        raise ProtocolError(f"Unknown admin command {command!r}: use one of "
                            f"{', '.join(COMMANDS)}.", command=command)
    return handler(registry, args, now)


def answer(registry: RegistryView, identity: bytes, message: Message,
           now: float) -> list[Send]:
    """What the broker sends for an ADMIN message that showed the admin token: the command's
    messages and its ADMIN_REPLY, or the error that says why it was not run."""
    command = message.body["command"]
    try:
        result, sends = run(registry, command, message.body["args"], now)
    except FabricError as exc:
        registry.counters["admin_errors"] += 1
        return [send_error(Side.FRONTEND, identity, exc, request=message.request)]
    registry.counters["admin_commands"] += 1
    log.info("admin command %s", command)  # (connection ids are not logged at INFO)
    return sends + [send_message(Side.FRONTEND, identity, Message(
        Kind.ADMIN_REPLY, 0, message.request, {"command": command, "result": result}))]
