"""The broker's Prometheus metrics: figures the I/O loop publishes, a collector that reads them.

Rule: a scrape never touches the registry. The registry belongs to the I/O loop's thread, and
prometheus_client answers scrapes in threads of its own; so the loop calls ``publish`` (at
most every ``interval`` seconds, and only when ``--metrics`` is on), which builds an immutable
snapshot of the figures from the registry (``figures``, sans I/O) and swaps it in with one
assignment; a scrape turns the latest snapshot into metric families (``families``, sans I/O)
and never waits for the loop, nor the loop for it.

Labels stay few: ``device`` and ``worker`` at most, plus small fixed sets (a state, a
direction, a refusal reason, an event name); never a session or connection id. The broker
sees data messages, not the ops inside them (it never decodes their bodies): ops, op time,
memory, graph calls and queued messages are what each worker last said of its devices in a
heartbeat (``fabric.core.protocol.WorkerReport``); a device whose worker has said nothing yet (or
is gone) has none of those samples.

Anyone who reaches the port may connect, so the server bounds what a connection costs: at
most ``MAX_CONNECTIONS`` are served at once (a thread each; one past them is closed at once,
unread), and each has ``READ_SECONDS`` in all to send its request and take the answer, then
it is closed (a request begun and never finished held a thread for ever).
"""

from __future__ import annotations

import io
import ipaddress
import socket
import threading
import time
from itertools import accumulate, islice
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from fabric.core.protocol import OP_SECONDS_BUCKETS, DeviceReport, LinkReport

from .admin_service import RegistryView, device_traffic, lost_workers, pair_status
from .dashboard import Dashboard, route
from .model import Traffic

PUBLISH_INTERVAL = 0.25  # seconds between snapshots: what a scrape sees is at most this old
MAX_CONNECTIONS = 8  # connections served at once (a thread each); more are closed at once
READ_SECONDS = 5.0  # a connection's time to send its request and take the answer, in all
DEFAULT_HOST = "127.0.0.1"  # a bare port binds to loopback only
PREFIX = "fabric_"
MAX_LISTED_SESSIONS = 200  # sessions the dashboard lists (the first); the rest are counted
WATCH_SECONDS = 10.0  # the dashboard's detail is published this long after its last request


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or a bare ``PORT`` (loopback) as (host, port); port 0
    picks a free one. Raises ValueError with a sentence that says what to write."""
    host, _, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if (not port.isdigit() or not 0 <= int(port) <= 65535
            or (":" in host and not (bracketed and _is_ip(host)))):
        raise ValueError(f"{text!r} is not an address to serve metrics on: write HOST:PORT, "
                         f"like {DEFAULT_HOST}:9464 ([::1]:9464 for IPv6), or a port alone "
                         "for loopback.")
    return host or DEFAULT_HOST, int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _worker_state(worker: Any) -> str:
    return "draining" if worker.draining else "ready" if worker.ready else "attaching"


def _count_by(values: Any, *states: str) -> dict[str, int]:
    counts = dict.fromkeys(states, 0)
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def figures(registry: RegistryView, now: float, held: int,
            detail: bool = False) -> Mapping[str, Any]:
    """What the metrics show, read from the registry at ``now`` (``held``: refusal answers
    the loop holds back): fresh copies, in read-only mappings and tuples, that nothing
    changes once built. With ``detail`` (while someone watches the dashboard), also the
    first sessions (``MAX_LISTED_SESSIONS`` at most, no ids) and the workers lost."""
    online = {d["index"] for d in registry.devices}
    by_name = {w.name: w for w in registry.workers.values()}
    reports = {name: w.report for name, w in by_name.items() if w.report is not None}
    traffic = device_traffic(registry)
    sessions_on: dict[tuple[str, int], int] = {}
    for session in registry.sessions.values():
        key = (registry.workers[session.worker].name, session.local)
        sessions_on[key] = sessions_on.get(key, 0) + 1
    devices = tuple(
        MappingProxyType({"device": str(index), "worker": name, "online": index in online,
                          "backend": by_name[name].backend if name in by_name else None,
                          "host": by_name[name].host if name in by_name else None,
                          "draining": name in by_name and by_name[name].draining,
                          "sessions": sessions_on.get((name, local), 0),
                          "traffic": traffic.get((name, local), Traffic()),
                          "report": reports[name].device(local) if name in reports else None})
        for index, (name, local) in sorted(registry.device_slots.items()))
    counters = registry.counters
    snapshot = {
        "server": registry.server,
        "uptime": now - registry.started,
        "workers": _count_by(map(_worker_state, registry.workers.values()),
                             "ready", "attaching", "draining"),
        "devices": devices,
        "budgets": {name: report.budget_bytes for name, report in reports.items()
                    if report.budget_bytes is not None},
        "link_refusals": {name: report.link_refusals for name, report in reports.items()},
        "links": {name: report.links for name, report in reports.items()},
        "sessions": _count_by((s.phase.value for s in registry.sessions.values()),
                              "opening", "open", "closing", "resumable"),
        "sessions_opened": counters["hellos"],
        "sessions_ended": sum(t.sessions for t in registry.retired.values()),
        "refusals": dict(registry.rejects),
        "tokens_refused": counters["tokens_refused"],
        "workers_lost": counters["workers_lost"],
        "queues": {"parked_messages": 0, "parked_bytes": 0, "peers_waiting": 0,
                   "frontend_paused": False, **registry.queue_figures()},
        "held_answers": held,
        "events": dict(counters),
        "pair": pair_status(registry.pair, now),
        # A takeover's sessions (``broker.resume``): reported by workers, resumed by their
        # clients, ended unclaimed or unknown, and RESUMEs refused (a wrong secret or token)
        "resumes": {name: counters[name] for name in (
            "sessions_reported", "sessions_resumed", "sessions_not_resumed",
            "resumes_refused")},
    }
    if detail:
        snapshot["listed_sessions"] = _listed_sessions(registry, now)
        snapshot["lost"] = tuple(MappingProxyType({**row, "devices": tuple(row["devices"])})
                                 for row in lost_workers(registry, now))
    return MappingProxyType(snapshot)


def _listed_sessions(registry: RegistryView, now: float) -> tuple[Mapping[str, Any], ...]:
    """The sessions the broker took first (``MAX_LISTED_SESSIONS`` at most, oldest first):
    device, worker, state, age, traffic, and the bytes they hold and ops they ran as their
    worker last reported (None before it has); never an id (the dashboard shows them to whoever
    holds the admin token, and a session's id is what closes it). The registry holds them in
    the order it took them, so this reads that many, whatever the count."""
    first = sorted(islice(registry.sessions.values(), MAX_LISTED_SESSIONS),
                   key=lambda s: (s.created, s.id))
    # what each worker's last heartbeat said its devices hold and ran for these sessions
    held = {(worker, entry.session): entry for worker, w in registry.workers.items()
            if w.report is not None for entry in w.report.sessions}
    rows = []
    for session in first:
        entry = held.get((session.worker, session.id))
        rows.append(MappingProxyType({
            "device": session.device, "worker": registry.workers[session.worker].name,
            "state": session.phase.value, "age": now - session.created,
            "resident_bytes": None if entry is None else entry.resident_bytes,
            "ops": None if entry is None else entry.ops,
            "bytes_in": session.bytes_in, "bytes_out": session.bytes_out,
            "submits": session.submits, "errors": session.errors}))
    return tuple(rows)


EMPTY: Mapping[str, Any] = MappingProxyType({})


def _gauge(name: str, documentation: str, value: float | None = None,
           labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value,
                             labels=list(labels) if labels else None)


def _counter(name: str, documentation: str, value: float | None = None,
             labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, documentation, value=value,
                               labels=list(labels) if labels else None)


def _by_label(make: Callable[..., Metric], name: str, documentation: str, label: str,
              counts: Mapping[str, float]) -> Metric:
    """A family of one ``label``, with a sample per key of ``counts``."""
    family = make(name, documentation, labels=(label,))
    for key, value in sorted(counts.items()):
        family.add_metric([key], value)
    return family


def _device_families(devices: tuple[Mapping[str, Any], ...]) -> Iterator[Metric]:
    labels = ("device", "worker")
    online = _gauge("device_online", "1 while the device's worker is connected, else 0.",
                    labels=labels)
    sessions = _gauge("device_sessions", "Sessions the broker holds on the device now.",
                      labels=labels)
    messages = _counter("routed_messages_total", "Data messages routed, by direction: "
                        "to_device (from clients, and tensors moving in from another device) "
                        "or to_client.", labels=(*labels, "direction"))
    sizes = _counter("routed_bytes_total", "Bytes of the data messages routed, by direction "
                     "(as routed_messages_total).", labels=(*labels, "direction"))
    submits = _counter("device_submits_total", "Batches of ops sent to the device (SUBMITs, "
                       "and requests that carry one).", labels=labels)
    errors = _counter("device_errors_total", "ERROR messages the device sent about a "
                      "session.", labels=labels)
    for device in devices:
        key = [device["device"], device["worker"]]
        traffic: Traffic = device["traffic"]
        online.add_metric(key, 1.0 if device["online"] else 0.0)
        sessions.add_metric(key, device["sessions"])
        for direction, count, size in (("to_device", traffic.messages_in, traffic.bytes_in),
                                       ("to_client", traffic.messages_out, traffic.bytes_out)):
            messages.add_metric([*key, direction], count)
            sizes.add_metric([*key, direction], size)
        submits.add_metric(key, traffic.submits)
        errors.add_metric(key, traffic.errors)
    yield from (online, sessions, messages, sizes, submits, errors)
    yield from _reported_families(
        [([device["device"], device["worker"]], device["report"]) for device in devices
         if device["report"] is not None])


_BUCKET_BOUNDS = [*map(floatToGoString, OP_SECONDS_BUCKETS), "+Inf"]


def _reported_families(reports: list[tuple[list[str], DeviceReport]]) -> Iterator[Metric]:
    """The families of what workers report of their devices, each with its labels."""
    labels = ("device", "worker")
    resident = _gauge("device_memory_resident_bytes", "Bytes the device's sessions hold "
                      "(their tensors), as its worker last reported.", labels=labels)
    ops = _counter("device_ops_total", "Ops the device ran (each entry of a batch; a graph "
                   "call is one).", labels=labels)
    op_time = HistogramMetricFamily(
        PREFIX + "device_op_seconds", "Seconds per op: each batch's time spread over its ops "
        "(measured per batch, not per op); count is ops run.", labels=labels)
    replays = _counter("device_graph_replays_total", "Calls of a graph the device already "
                       "held and had run: the graph cache's hits.", labels=labels)
    registrations = _counter("device_graph_registrations_total", "Graphs registered on the "
                             "device (traced and sent by a client).", labels=labels)
    queued = _gauge("device_queued_messages", "Messages the device has read from the broker "
                    "and not yet run.", labels=labels)
    shm = _counter("device_shared_memory_transfers_total", "Arrays that went past the broker "
                   "through shared memory with a client on the device's host, by direction: "
                   "to_device (uploads, tensors moved in) or to_client (reads, tensors moved "
                   "out).", labels=(*labels, "direction"))
    shm_bytes = _counter("device_shared_memory_bytes_total", "Bytes of those arrays, by "
                         "direction (as device_shared_memory_transfers_total).",
                         labels=(*labels, "direction"))
    pool = _gauge("device_shared_memory_pool_bytes", "Bytes of the device's own shared-memory "
                  "pool (segments free or lent), as its worker last reported.", labels=labels)
    for key, report in reports:
        resident.add_metric(key, report.resident_bytes)
        ops.add_metric(key, report.ops)
        op_time.add_metric(key, list(zip(_BUCKET_BOUNDS, accumulate(report.op_buckets))),
                           report.op_seconds)
        replays.add_metric(key, report.graph_replays)
        registrations.add_metric(key, report.graph_registrations)
        queued.add_metric(key, report.queued)
        for direction, count, size in (("to_device", report.shm_in, report.shm_in_bytes),
                                       ("to_client", report.shm_out, report.shm_out_bytes)):
            shm.add_metric([*key, direction], count)
            shm_bytes.add_metric([*key, direction], size)
        pool.add_metric(key, report.pool_bytes)
    yield from (resident, ops, op_time, replays, registrations, queued, shm, shm_bytes, pool)


def _link_families(links: Mapping[str, LinkReport]) -> Iterator[Metric]:
    """The families of what workers report of their direct links."""
    transfers = _counter("worker_link_transfers_total", "Tensors moved between workers over "
                         "a direct link, past the broker, by direction: sent (taken by the "
                         "receiver) or received.", labels=("worker", "direction"))
    sizes = _counter("worker_link_bytes_total", "Bytes of those tensors, by direction (as "
                     "worker_link_transfers_total).", labels=("worker", "direction"))
    for name, report in sorted(links.items()):
        for direction, count, size in (("sent", report.sent, report.sent_bytes),
                                       ("received", report.received, report.received_bytes)):
            transfers.add_metric([name, direction], count)
            sizes.add_metric([name, direction], size)
    yield from (transfers, sizes)
    yield _by_label(_counter, "worker_link_fallbacks_total", "Tensors for a direct link that "
                    "went through the broker instead: no grant or connection in time, or a "
                    "link that broke before the receiver took them.", "worker",
                    {name: report.fallbacks for name, report in links.items()})


def families(snapshot: Mapping[str, Any]) -> list[Metric]:
    """The metric families of one snapshot of ``figures`` (none before the first)."""
    if not snapshot:
        return []
    devices = snapshot["devices"]
    queues = snapshot["queues"]
    online = sum(1 for device in devices if device["online"])
    return [
        _gauge("uptime_seconds", "Seconds since the broker started.", snapshot["uptime"]),
        _by_label(_gauge, "workers", "Connected workers by state: ready, attaching (not all "
                  "device lanes heard from yet) or draining.", "state", snapshot["workers"]),
        _by_label(_gauge, "devices", "Device indexes by state: online, or offline (their worker "
                  "is gone; the index is kept for it).", "state",
                  {"online": online, "offline": len(devices) - online}),
        *_device_families(devices),
        _by_label(_gauge, "worker_memory_budget_bytes", "Bytes all of a worker's devices may "
                  "hold (its --memory-budget), as it last reported.", "worker",
                  snapshot["budgets"]),
        _by_label(_counter, "worker_link_refusals_total", "Peers a worker's direct-link "
                  "endpoint refused, as it last reported: a handshake showing a ticket the "
                  "broker did not give it (or a used or late one), or a message the ticket "
                  "does not allow.", "worker", snapshot["link_refusals"]),
        *_link_families(snapshot["links"]),
        _by_label(_gauge, "sessions", "Sessions by state: opening, open or closing.", "state",
                  snapshot["sessions"]),
        _counter("sessions_opened_total", "HELLOs accepted: sessions sent to a device to open.",
                 snapshot["sessions_opened"]),
        _counter("sessions_ended_total", "Sessions ended, for any reason.",
                 snapshot["sessions_ended"]),
        _by_label(_counter, "refusals_total", "Refusals by reason (the error code, such as "
                  "AuthenticationError): sessions refused (HELLO), workers refused (REGISTER), "
                  "admin commands refused, connections refused in the ZeroMQ handshake.",
                  "reason", snapshot["refusals"]),
        _counter("tokens_refused_total", "Failed authentications: tokens or keys refused, in "
                 "the ZeroMQ handshake or in a message.", snapshot["tokens_refused"]),
        _counter("workers_lost_total", "Workers lost: disconnected, silent past the liveness "
                 "bound, not reading, or replaced.", snapshot["workers_lost"]),
        _gauge("queue_parked_messages", "Messages parked for peers whose queue is full.",
               queues["parked_messages"]),
        _gauge("queue_parked_bytes", "Bytes of the parked messages.", queues["parked_bytes"]),
        _gauge("queue_peers_waiting", "Peers with parked messages.", queues["peers_waiting"]),
        _gauge("frontend_paused", "1 while clients are not read because a worker's queue is "
               "full, else 0.", 1.0 if queues["frontend_paused"] else 0.0),
        _gauge("held_answers", "Answers to refused tokens held back (the auth delay).",
               snapshot["held_answers"]),
        _by_label(_counter, "broker_events_total", "Every event the broker counts, by name (as "
                  "fabric admin status lists them under counters).", "event",
                  snapshot["events"]),
        *_pair_families(snapshot["pair"], snapshot["resumes"]),
    ]


def _pair_families(pair: Mapping[str, Any] | None,
                   resumes: Mapping[str, int]) -> Iterator[Metric]:
    """A pair broker's state (1 for the state it is in), term, takeovers and the sessions
    they resumed or lost; none without a peer."""
    if pair is None:
        return
    yield _by_label(_gauge, "pair_state", "1 for the state this broker of a pair is in "
                    "(primary, backup: starting; active: serves; passive: refuses), else 0.",
                    "state", {state: float(state == pair["state"]) for state in
                              ("primary", "backup", "active", "passive")})
    yield _gauge("pair_term", "The pair's term this broker serves under (raised by each "
                 "takeover).", pair["term"])
    yield _counter("pair_takeovers_total", "Times this broker took over from a silent peer.",
                   pair["takeovers"])
    if pair["takeover_wait"] is not None:
        yield _gauge("pair_takeover_wait_seconds", "How long the peer had been silent when "
                     "this broker last took over.", pair["takeover_wait"])
    yield _counter("pair_sessions_reported_total", "Sessions workers kept when their broker "
                   "went and reported to this one.", resumes["sessions_reported"])
    yield _counter("pair_sessions_resumed_total", "Reported sessions their clients resumed "
                   "here.", resumes["sessions_resumed"])
    yield _counter("pair_sessions_not_resumed_total", "Sessions not resumed: unclaimed past "
                   "--resume-grace, or asked for and unknown here.",
                   resumes["sessions_not_resumed"])
    yield _counter("pair_resumes_refused_total", "RESUMEs refused for a wrong secret or "
                   "token.", resumes["resumes_refused"])


class FabricCollector(Collector):
    """A prometheus_client collector over the latest snapshot that ``latest`` returns."""

    def __init__(self, latest: Callable[[], Mapping[str, Any]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        """The metric families of the latest snapshot (one read of it per scrape)."""
        return iter(families(self._latest()))


class _Deadline(io.RawIOBase):
    """A connection's bytes as a file, each read waiting at most until ``deadline``; past it
    a read raises ``TimeoutError`` (a timeout per read alone would let a byte every few
    seconds hold the connection for ever)."""

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        self._connection = connection
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the connection's read time is up")
        self._connection.settimeout(left)  # (and what is left of it for the answer)
        return self._connection.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    """One request per connection, read and answered within ``READ_SECONDS``; logs
    nothing."""

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_Deadline(self.connection,
                                                 time.monotonic() + READ_SECONDS))

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (every scrape would be a line)."""


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's server (a daemon thread per connection), serving at most
    ``MAX_CONNECTIONS`` at once; a connection that times out or fails ends quietly."""

    request_queue_size = 128  # (listen's backlog: a burst of connections is taken, then
    # closed, rather than made to retry its SYN for seconds)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0  # connections closed at once: every slot was taken
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # (starts its thread)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or broke: closed, not logged (any peer causes it)."""


def _serve(host: str, port: int, app: Callable[..., Any],
           ) -> tuple[_BoundedServer, threading.Thread]:
    """The WSGI ``app`` at (host, port), serving from a daemon thread."""
    family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                flags=socket.AI_PASSIVE)[0]
    address = where[0]
    server_class = type("_Server", (_BoundedServer,), {"address_family": family})
    server = make_server(address, port, app, server_class, handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="fabric-metrics", daemon=True)
    thread.start()
    return server, thread


class MetricsPublisher:
    """The snapshot the I/O loop publishes and the HTTP server's threads read; and that
    server, bound where the operator said: Prometheus' /metrics, and the dashboard under
    /dashboard for whoever shows ``admin_token`` (``broker.dashboard``)."""

    def __init__(self, host: str, port: int, interval: float = PUBLISH_INTERVAL,
                 admin_token: str | None = None) -> None:
        self.latest: Mapping[str, Any] = EMPTY
        self.due = 0.0  # when the loop publishes next
        self.watched_until = 0.0  # the detail is published until then (monotonic clock)
        self._interval = interval
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FabricCollector(lambda: self.latest))
        dashboard = Dashboard(admin_token, lambda: self.latest, self._watched)
        self._server, self._thread = _serve(host, port,
                                            route(dashboard, make_wsgi_app(registry)))

    def _watched(self) -> None:
        """The dashboard asked for data: publish the detail for a while (one assignment)."""
        self.watched_until = time.monotonic() + WATCH_SECONDS

    @property
    def url(self) -> str:
        """Where Prometheus scrapes (with the actual port when bound to port 0)."""
        host, port = self._server.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def publish(self, registry: RegistryView, now: float, held: int) -> None:
        """Swap in a fresh snapshot (one assignment: a scrape sees the old or the new); it
        holds the dashboard's detail only while the dashboard is watched."""
        self.latest = figures(registry, now, held, detail=now < self.watched_until)
        self.due = now + self._interval

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
