"""``fabric dashboard``'s library half: where a broker's dashboard is, and a link that signs a
browser in to it once.

Rule: the admin token travels only in the Authorization header of one POST to the dashboard,
which answers with a one-time ticket (``broker.dashboard``); the link carries the ticket,
good once and for a minute, never the token. The dashboard is served beside /metrics, so its
address is the /metrics URL that ``fabric cluster up`` writes into the admin file (or one
given).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from urllib.parse import urlencode, urlsplit

from fabric.client.admin import ADMIN_TOKEN_ENV, admin_source
from fabric.core.config import ADMIN_FILE_ENV, first_secret, load_admin_file
from fabric.core.errors import AuthenticationError, ConfigError, ConnectError

DASHBOARD_PATH = "/dashboard"
MAX_ANSWER_BYTES = 4096  # a ticket's answer is a few dozen bytes


def dashboard_address(metrics_url: str) -> str:
    """The dashboard's URL beside a broker's /metrics URL (``http://HOST:PORT/metrics``, or
    the server's root). Raises ConfigError for anything but an http URL."""
    url = urlsplit(metrics_url)
    if url.scheme != "http" or not url.netloc:
        raise ConfigError(f"{metrics_url!r} is not the broker's metrics address: give it as "
                          "http://HOST:PORT/metrics, as fabric cluster up prints it.")
    return url._replace(path=DASHBOARD_PATH, query="", fragment="").geturl()


def find_dashboard(url: str | None = None, *, token: str | None = None,
                   admin_file: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """The dashboard's URL and the admin token: ``url`` (its /metrics URL or its own), else
    the admin file's ``metrics``; ``token``, else $FABRIC_ADMIN_TOKEN, else the admin file's.
    The admin file is found as ``fabric admin`` finds it. Raises ConfigError saying what to
    pass where either is missing."""
    source = admin_source(None, admin_file, None)
    info = load_admin_file(source) if source is not None else {}
    metrics = url or info.get("metrics")
    if not metrics:
        where = f"{info['path']} names none" if info else "no admin file was found"
        raise ConfigError(
            f"No dashboard address: {where}. Start the cluster with --metrics HOST:PORT (the "
            f"dashboard is served beside /metrics), or pass its address (--url); set "
            f"{ADMIN_FILE_ENV} or pass --admin-file for another cluster's file.")
    token = first_secret(token, os.environ.get(ADMIN_TOKEN_ENV), info.get("admin_token"))
    if not token:
        raise ConfigError(f"No admin token: pass one (--token-file), set {ADMIN_TOKEN_ENV}, or "
                          "use the admin file fabric cluster up wrote (it holds it).")
    return dashboard_address(metrics), token


def sign_in_link(dashboard: str, token: str, timeout: float = 5.0) -> str:
    """A link to ``dashboard`` that signs a browser in, once, within the ticket's minute.

    Raises AuthenticationError when the dashboard refuses the token, ConnectError when nothing
    (or no fabric dashboard) answers there within ``timeout`` seconds."""
    request = urllib.request.Request(f"{dashboard}/ticket", data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            ticket = json.loads(answer.read(MAX_ANSWER_BYTES))["ticket"]
    except urllib.error.HTTPError as exc:
        if exc.code == 403:
            raise AuthenticationError(f"The dashboard at {dashboard} refused the token: it "
                                      "wants the broker's admin token.") from None
        raise ConnectError(f"The dashboard at {dashboard} answered {exc.code} {exc.reason}: "
                           "is that address the broker's --metrics?") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # (URLError is an OSError)
        raise ConnectError(f"No fabric dashboard answers at {dashboard} ({exc}): is the "
                           "broker running, with --metrics at that address?") from None
    return f"{dashboard}?{urlencode({'ticket': ticket})}"
