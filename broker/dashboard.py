"""The broker's dashboard: one page and its data, served beside Prometheus' /metrics.

Rule: the HTTP threads only read the latest snapshot the I/O loop published
(``broker.metrics``); nothing here touches the registry. The page (``dashboard.html``, a data
file of the package: HTML, CSS and the script that draws its SVG plots, no CDN) polls
``/dashboard/data``, the snapshot as JSON: devices, sessions (never their ids), lost workers.

It is an admin view, so every path under /dashboard wants the admin token, shown one of three
ways: as ``Authorization: Bearer TOKEN`` (scripts); through the sign-in form the page shows
without it (POSTed, so it is never in an address, a history or a log); or as a one-time ticket
that ``fabric dashboard`` asks for with the token (``POST /dashboard/ticket``) and opens the
browser with (``?ticket=``, good once, for ``TICKET_SECONDS``). The form and the ticket set an
HttpOnly, SameSite=Strict cookie holding an HMAC of the token (not the token), good while the
broker's token is. Tokens are compared in constant time; a request body is read only up to
``MAX_BODY_BYTES``; outstanding tickets are at most ``MAX_TICKETS``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import re
import secrets
import threading
import time
from base64 import b64encode
from http.cookies import CookieError, SimpleCookie
from importlib.resources import files
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import parse_qs

PATH = "/dashboard"
COOKIE = "fabric_dashboard"
TICKET_SECONDS = 60.0  # a ticket's life: long enough to open a browser, short in a history
MAX_TICKETS = 16  # outstanding at once; more are refused until some are used or expire
MAX_BODY_BYTES = 4096  # of a sign-in form (a token is 43 characters)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _hashes(page: str, tag: str) -> str:
    """CSP sources allowing exactly the page's inline ``tag`` elements (by their hash)."""
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
    return " ".join(f"'sha256-{b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                    for body in bodies)


PAGE = files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
# The page's own script and style run; nothing else does, and it loads nothing from elsewhere.
PAGE_POLICY = (f"default-src 'none'; script-src {_hashes(PAGE, 'script')}; "
               f"style-src {_hashes(PAGE, 'style')}; connect-src 'self'; img-src 'self'; "
               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SIGN_IN_POLICY = "default-src 'none'; form-action 'self'; frame-ancestors 'none'"
COMMON_HEADERS = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                  ("Referrer-Policy", "no-referrer")]


def _sign_in_page(note: str) -> bytes:
    return (f"<!doctype html><html lang=en><meta charset=utf-8><title>fabric dashboard</title>"
            f"<h1>fabric dashboard</h1><p>{html.escape(note)}</p>"
            f"<form method=post action={PATH}/login><label>Admin token "
            "<input type=password name=token autocomplete=off autofocus></label> "
            "<button>Sign in</button></form><p>fabric dashboard signs in by itself; the "
            "token is the admin file's admin_token.</p></html>").encode()


def data(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The dashboard's view of one snapshot of ``broker.metrics.figures``: plain JSON, with no
    session id and no token. ``sessions`` and ``lost`` are None until a snapshot with the
    detail is published (the first request after a while without one asks for it)."""
    if not snapshot:
        return {"ready": False}
    budgets = snapshot["budgets"]
    devices = []
    for device in snapshot["devices"]:
        report, traffic = device["report"], device["traffic"]
        devices.append({
            "index": int(device["device"]), "worker": device["worker"],
            "backend": device["backend"], "host": device["host"], "online": device["online"],
            "draining": device["draining"], "sessions": device["sessions"],
            "resident_bytes": report and report.resident_bytes,
            "budget_bytes": budgets.get(device["worker"]),
            "ops": report and report.ops,
            # every byte the device took or gave: through the broker, and past it through
            # shared memory (what a direct link carries is the worker's, not the device's)
            "bytes": traffic.bytes + (report.shm_in_bytes + report.shm_out_bytes
                                      if report else 0)})
    listed = snapshot.get("listed_sessions")
    lost = snapshot.get("lost")
    return {
        "ready": True, "server": snapshot["server"], "role": _role(snapshot["pair"]),
        "uptime": snapshot["uptime"], "workers": dict(snapshot["workers"]),
        "workers_lost": snapshot["workers_lost"], "devices": devices,
        "sessions_by_state": dict(snapshot["sessions"]),
        "sessions_ended": snapshot["sessions_ended"],
        "sessions": None if listed is None else [dict(row) for row in listed],
        "lost": None if lost is None else [{**row, "devices": list(row["devices"])}
                                           for row in lost],
    }


def _role(pair: Mapping[str, Any] | None) -> str | None:
    """Each broker of a pair as the page names them, this one and the one it last heard:
    ``primary: active · peer: passive`` (None: no pair)."""
    if pair is None:
        return None
    return f"{pair['role']}: {pair['state']} · peer: {pair['peer_state'] or 'not heard'}"


class Dashboard:
    """The WSGI app of the paths under /dashboard, for a broker whose admin token is
    ``admin_token`` (None: the broker has none, and the dashboard refuses everyone).
    ``latest`` returns the latest snapshot; ``watched`` is called on each data request."""

    def __init__(self, admin_token: str | None, latest: Callable[[], Mapping[str, Any]],
                 watched: Callable[[], None]) -> None:
        self._token = admin_token.encode() if admin_token else None
        self._cookie = (hmac.new(self._token, b"fabric dashboard cookie", hashlib.sha256)
                        .hexdigest() if self._token else None)
        self._latest = latest
        self._watched = watched
        self._tickets: dict[str, float] = {}  # ticket: when it expires (monotonic)
        self._lock = threading.Lock()  # (the server answers each connection in a thread)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if self._token is None:
            return _answer(start_response, "403 Forbidden", _sign_in_page(
                "This broker has no admin token, so its dashboard is off: start it with "
                "one (fabric cluster up gives it one)."), "text/html", SIGN_IN_POLICY)
        if path in (PATH, PATH + "/") and method == "GET":
            return self._page(environ, start_response)
        if path == PATH + "/data" and method == "GET":
            if not self._authorized(environ):
                return _answer(start_response, "401 Unauthorized", json.dumps(
                    {"error": "Show the admin token: sign in on the page, or send it as "
                     "Authorization: Bearer TOKEN."}).encode(), "application/json")
            self._watched()
            return _answer(start_response, "200 OK", json.dumps(data(self._latest())).encode(),
                           "application/json")
        if path == PATH + "/login" and method == "POST":
            token = parse_qs(_body(environ).decode("utf-8", "replace")).get("token", [""])[0]
            if not hmac.compare_digest(token.strip().encode(), self._token):
                return _answer(start_response, "403 Forbidden", _sign_in_page(
                    "That is not this broker's admin token."), "text/html", SIGN_IN_POLICY)
            return self._signed_in(start_response)
        if path == PATH + "/ticket" and method == "POST":
            return self._ticket(environ, start_response)
        return _answer(start_response, "404 Not Found", b"not found\n", "text/plain")

    def _authorized(self, environ: dict[str, Any]) -> bool:
        scheme, _, shown = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(shown.strip().encode(), self._token)
        try:
            morsel = SimpleCookie(environ.get("HTTP_COOKIE", "")).get(COOKIE)
        except CookieError:
            return False
        return morsel is not None and hmac.compare_digest(morsel.value.encode(),
                                                          self._cookie.encode())

    def _page(self, environ: dict[str, Any], start_response: StartResponse
              ) -> Iterable[bytes]:
        ticket = parse_qs(environ.get("QUERY_STRING", "")).get("ticket", [""])[0]
        if ticket:
            if self._use_ticket(ticket):
                return self._signed_in(start_response)
            note = "That sign-in link was used already or is too old: run fabric dashboard again."
        elif self._authorized(environ):
            return _answer(start_response, "200 OK", PAGE.encode(), "text/html", PAGE_POLICY)
        else:
            note = "This page shows the cluster's sessions: it wants the admin token."
        return _answer(start_response, "401 Unauthorized", _sign_in_page(note), "text/html",
                       SIGN_IN_POLICY)

    def _signed_in(self, start_response: StartResponse) -> Iterable[bytes]:
        """The cookie, and the page again at its plain address (no ticket in the history)."""
        start_response("303 See Other", [
            ("Location", PATH),
            ("Set-Cookie", f"{COOKIE}={self._cookie}; Path={PATH}; HttpOnly; SameSite=Strict"),
            ("Content-Length", "0"), *COMMON_HEADERS])
        return [b""]

    def _ticket(self, environ: dict[str, Any], start_response: StartResponse
                ) -> Iterable[bytes]:
        scheme, _, shown = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(shown.strip().encode(),
                                                                 self._token):
            return _answer(start_response, "403 Forbidden", json.dumps(
                {"error": "A ticket is for the admin token's holder: send it as "
                 "Authorization: Bearer TOKEN."}).encode(), "application/json")
        now = time.monotonic()
        with self._lock:
            self._tickets = {t: until for t, until in self._tickets.items() if until > now}
            if len(self._tickets) >= MAX_TICKETS:
                return _answer(start_response, "429 Too Many Requests", json.dumps(
                    {"error": f"{MAX_TICKETS} sign-in tickets are outstanding: use one, or "
                     f"wait {TICKET_SECONDS:.0f} s."}).encode(), "application/json")
            ticket = secrets.token_urlsafe(32)
            self._tickets[ticket] = now + TICKET_SECONDS
        return _answer(start_response, "200 OK", json.dumps(
            {"ticket": ticket, "seconds": TICKET_SECONDS}).encode(), "application/json")

    def _use_ticket(self, ticket: str) -> bool:
        with self._lock:
            until = self._tickets.pop(ticket, 0.0)  # (a dict lookup: the key is random)
        return until > time.monotonic()


def _body(environ: dict[str, Any]) -> bytes:
    """The request's body, ``MAX_BODY_BYTES`` at most (the rest is never read)."""
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_BODY_BYTES)
    except ValueError:
        return b""
    return environ["wsgi.input"].read(length) if length > 0 else b""


def _answer(start_response: StartResponse, status: str, body: bytes, kind: str,
            policy: str = SIGN_IN_POLICY) -> Iterable[bytes]:
    start_response(status, [("Content-Type", f"{kind}; charset=utf-8"),
                            ("Content-Length", str(len(body))),
                            ("Content-Security-Policy", policy), *COMMON_HEADERS])
    return [body]


def route(dashboard: WsgiApp, metrics: WsgiApp) -> WsgiApp:
    """One app for the server: paths under /dashboard to ``dashboard``, the rest to
    ``metrics`` (Prometheus' app, as it was)."""
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == PATH or path.startswith(PATH + "/"):
            return dashboard(environ, start_response)
        return metrics(environ, start_response)
    return app
