"""The dashboard sans I/O: its data view of a registry's snapshot, and its WSGI app called
with plain environ dicts (the token, the cookie, tickets, bounds); the browser test is
tests/cluster/test_dashboard.py."""

from __future__ import annotations

import io
import json
from typing import Any

from test_admin_commands import ADMIN_TOKEN, B, busy_registry

from fabric.broker import metrics
from fabric.broker.dashboard import (COOKIE, MAX_BODY_BYTES, MAX_TICKETS, Dashboard, data,
                                     route)
from fabric.broker.metrics import figures
from fabric.broker.model import Side
from fabric.broker.pair import Pair, State
from fabric.core.protocol import OP_SECONDS_BUCKETS, DeviceReport, SessionReport, WorkerReport


def call(app: Any, path: str, method: str = "GET", body: bytes = b"",
         **headers: str) -> tuple[str, dict[str, str], bytes]:
    """One request to a WSGI app: its status, headers and body."""
    answer: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        answer.update(status=status, headers=dict(response_headers))

    path, _, query = path.partition("?")
    environ = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method,
               "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
               **{f"HTTP_{name.upper()}": value for name, value in headers.items()}}
    content = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], content


def dashboard(token: str | None = ADMIN_TOKEN) -> tuple[Dashboard, list[int]]:
    watched: list[int] = []
    snapshot = figures(busy_registry(), 2.0, 0, detail=True)
    return Dashboard(token, lambda: snapshot, lambda: watched.append(1)), watched


def test_the_data_lists_sessions_without_ids_and_only_while_watched():
    registry = busy_registry()
    assert "listed_sessions" not in figures(registry, 2.0, 0)  # (nobody watching: no detail)
    view = data(figures(registry, 2.0, 0, detail=True))
    json.dumps(view)  # (plain JSON)
    assert [(s["device"], s["state"], s["age"]) for s in view["sessions"]] == \
        [(0, "open", 2.0), (2, "open", 1.5)]
    seven = registry.sessions[7]
    assert (view["sessions"][0]["bytes_in"], view["sessions"][0]["submits"]) == \
        (seven.bytes_in, seven.submits)
    assert all(set(s) == {"device", "worker", "state", "age", "resident_bytes", "ops",
                          "bytes_in", "bytes_out", "submits", "errors"} for s in view["sessions"])
    # (no worker has reported yet: what the sessions hold is not known)
    assert {(s["resident_bytes"], s["ops"]) for s in view["sessions"]} == {(None, None)}
    assert view["role"] is None and view["lost"] == []
    assert data(figures(registry, 2.0, 0))["sessions"] is None
    assert data({}) == {"ready": False}


def test_a_session_shows_what_its_worker_reported_it_holds():
    registry = busy_registry()
    seven = registry.sessions[7]
    worker = registry.workers[seven.worker]
    worker.report = WorkerReport(None, (DeviceReport(0, (0,) * (len(OP_SECONDS_BUCKETS) + 1),
                                                     0.0, 0, 0, 0),) * len(worker.devices),
                                 sessions=(SessionReport(7, 4096, 12),
                                           SessionReport(99, 1, 1)))  # (99: not the broker's)
    rows = data(figures(registry, 2.0, 0, detail=True))["sessions"]
    assert [(s["device"], s["resident_bytes"], s["ops"]) for s in rows] == \
        [(0, 4096, 12), (2, None, None)]


def test_a_pair_s_broker_names_its_role_and_its_peer_s_state():
    registry = busy_registry()
    registry.pair = Pair(primary=False, heartbeat=1.0, liveness=2, now=0.0)
    assert data(figures(registry, 2.0, 0))["role"] == "backup: backup · peer: not heard"
    registry.pair.state, registry.pair.peer_state = State.PASSIVE, State.ACTIVE
    assert data(figures(registry, 2.0, 0))["role"] == "backup: passive · peer: active"


def test_a_lost_worker_is_listed_with_when_and_its_devices_offline():
    registry = busy_registry()
    registry.unroutable(Side.WORKERS, B, 4.0)  # the worker of devices 1 and 2 vanished
    view = data(figures(registry, 10.0, 0, detail=True))
    assert [(w["name"], w["devices"]) for w in view["lost"]] == [("b", [1, 2])]
    assert 0 < view["lost"][0]["lost_ago"] <= 10.0
    assert [(d["index"], d["online"]) for d in view["devices"]] == \
        [(0, True), (1, False), (2, False)]
    assert view["workers_lost"] == 1 and [s["device"] for s in view["sessions"]] == [0]


def test_at_most_the_oldest_sessions_are_listed(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_LISTED_SESSIONS", 1)
    listed = data(figures(busy_registry(), 2.0, 0, detail=True))
    assert [s["device"] for s in listed["sessions"]] == [0]
    assert listed["sessions_by_state"]["open"] == 2


def test_every_path_wants_the_admin_token():
    app, watched = dashboard()
    for path, method in (("/dashboard", "GET"), ("/dashboard/data", "GET")):
        status, headers, body = call(app, path, method)
        assert status.startswith("401") and ADMIN_TOKEN.encode() not in body
        assert call(app, path, method, Authorization="Bearer wrong")[0].startswith("401")
    assert call(app, "/dashboard/ticket", "POST")[0].startswith("403")
    assert call(app, "/dashboard/login", "POST", b"token=wrong")[0].startswith("403")
    assert not watched  # (refused requests ask for no detail)
    status, _, body = call(app, "/dashboard/data", Authorization=f"Bearer {ADMIN_TOKEN}")
    assert status == "200 OK" and watched and b"0x" not in body
    assert json.loads(body)["sessions"][0]["device"] == 0
    status, headers, page = call(app, "/dashboard", Authorization=f"Bearer {ADMIN_TOKEN}")
    assert status == "200 OK" and "script-src 'sha256-" in headers["Content-Security-Policy"]
    assert b"<script>" in page and b" src=" not in page and b"<link" not in page  # (no CDN)


def test_without_an_admin_token_the_dashboard_is_off():
    app, _ = dashboard(token=None)
    status, _, body = call(app, "/dashboard", Authorization="Bearer ")
    assert status.startswith("403") and b"no admin token" in body


def test_the_form_sets_a_cookie_of_an_hmac_and_reads_a_bounded_body():
    app, _ = dashboard()
    status, headers, _ = call(app, "/dashboard/login", "POST", f"token={ADMIN_TOKEN}".encode())
    assert status.startswith("303") and headers["Location"] == "/dashboard"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert cookie.startswith(f"{COOKIE}=") and ADMIN_TOKEN not in cookie
    assert call(app, "/dashboard/data", Cookie=cookie)[0] == "200 OK"
    assert call(app, "/dashboard/data", Cookie=cookie + "0")[0].startswith("401")
    assert call(app, "/dashboard/data", Cookie="\x00;;=")[0].startswith("401")
    past = b"x=" + b"y" * MAX_BODY_BYTES + f"&token={ADMIN_TOKEN}".encode()
    assert call(app, "/dashboard/login", "POST", past)[0].startswith("403")


def test_a_ticket_signs_in_once_and_few_are_outstanding():
    app, _ = dashboard()
    tickets = []
    for _ in range(MAX_TICKETS):
        status, _, body = call(app, "/dashboard/ticket", "POST",
                               Authorization=f"Bearer {ADMIN_TOKEN}")
        tickets.append(json.loads(body)["ticket"])
    assert call(app, "/dashboard/ticket", "POST",
                Authorization=f"Bearer {ADMIN_TOKEN}")[0].startswith("429")
    status, headers, _ = call(app, f"/dashboard?ticket={tickets[0]}")
    assert status.startswith("303") and headers["Set-Cookie"].startswith(f"{COOKIE}=")
    status, _, body = call(app, f"/dashboard?ticket={tickets[0]}")
    assert status.startswith("401") and b"used already" in body
    assert call(app, "/dashboard?ticket=made-up")[0].startswith("401")


def test_other_paths_go_to_prometheus():
    app, _ = dashboard()
    served = route(app, lambda environ, start: (start("200 OK", []), [b"metrics"])[1])
    assert call(served, "/metrics")[2] == b"metrics"
    assert call(served, "/dashboardx")[2] == b"metrics"
    assert call(served, "/dashboard/nothing", Authorization=f"Bearer {ADMIN_TOKEN}")[0] \
        .startswith("404")
