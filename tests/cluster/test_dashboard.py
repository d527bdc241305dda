"""The broker's dashboard: a real cluster with --metrics, its page driven in headless Chromium
(live data, a session that comes and goes, a device's memory plot that moves with an upload),
and, without a browser, its refusals of whoever lacks the admin token and what its answers
never hold (a session id, a token); ``fabric dashboard`` finding it from the admin file."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from browser import chromium_missing, headless_chromium
from conftest import HEARTBEAT
from fabric import LocalCluster
from fabric.broker.dashboard import COOKIE, MAX_BODY_BYTES
from fabric.cli.main import main
from fabric.client.dashboard import dashboard_address, sign_in_link
from polling import wait_for

pytestmark = pytest.mark.timeout(120)

UPLOAD = np.ones(8 << 20)  # 64 MiB of float64
LIVE_SECONDS = 20.0  # for the page to show what the cluster did (polls every second)


@pytest.fixture(scope="module")
def watched():
    with LocalCluster(workers=2, heartbeat=HEARTBEAT,
                      broker_args=("--metrics", "127.0.0.1:0")) as running:
        yield running


def ask(url: str, method: str = "GET", body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request, redirects not followed: status, headers, body."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        connection.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def secrets_of(cluster: LocalCluster) -> list[bytes]:
    return [token.encode() for token in (cluster.token, cluster.admin_token,
                                         cluster.worker_token)]


def test_refused_without_the_admin_token(watched):
    page = dashboard_address(watched.metrics_url)
    for path in ("", "/", "/data"):
        status, _, body = ask(page + path)
        assert status == 401, path
        assert not any(secret in body for secret in secrets_of(watched))
    for wrong in (watched.token, watched.worker_token, "x" * 43):  # a client's token is no key
        assert ask(page + "/data", headers=bearer(wrong))[0] in (401, 403)
        assert ask(page + "/ticket", "POST", b"", bearer(wrong))[0] == 403
        status, _, body = ask(page + "/login", "POST", f"token={wrong}".encode(),
                              {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 403 and b"That is not this broker" in body
    # Only MAX_BODY_BYTES of a form are read: a token past them is never seen.
    padded = b"pad=" + b"x" * MAX_BODY_BYTES + f"&token={watched.admin_token}".encode()
    assert ask(page + "/login", "POST", padded,
               {"Content-Type": "application/x-www-form-urlencoded"})[0] == 403
    assert ask(page + "/elsewhere", headers=bearer(watched.admin_token))[0] == 404


def test_the_token_signs_in_and_no_answer_holds_an_id_or_a_token(watched):
    page = dashboard_address(watched.metrics_url)
    status, headers, _ = ask(page + "/login", "POST", f"token={watched.admin_token}".encode(),
                             {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and headers["Location"] == "/dashboard"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert watched.admin_token not in cookie  # (an HMAC of it)
    signed_in = {"Cookie": cookie.split(";")[0]}
    assert signed_in["Cookie"].startswith(COOKIE + "=")
    with watched.connect(device=1) as session:
        held = session.asarray(np.arange(1000.0))
        held.sum().numpy()

        def listed() -> Any:  # (once the worker's heartbeat has said what the session holds)
            view = json.loads(ask(page + "/data", headers=signed_in)[2])
            return view.get("sessions") and view["sessions"][0]["resident_bytes"] and view

        view = wait_for(listed, 10, "the session in the dashboard's data")
        assert [(row["device"], row["worker"], row["state"]) for row in view["sessions"]] == \
            [(1, "worker-1", "open")]
        # what the device holds for it: the upload (and the sum's 0-d result, if not freed
        # yet), and the ops it ran
        assert held.nbytes <= view["sessions"][0]["resident_bytes"] <= held.nbytes + 8
        assert view["sessions"][0]["ops"] >= 2
        assert [d["worker"] for d in view["devices"]] == ["worker-0", "worker-1"]
        answers = [ask(page + path, headers=signed_in)[2] for path in ("", "/data")]
        answers.append(ask(page + "/data", headers=bearer(watched.admin_token))[2])
        for body in answers:
            for id_text in (f"{session.id:#018x}", f"{session.id:x}", str(session.id)):
                assert id_text.encode() not in body
            assert not any(secret in body for secret in secrets_of(watched))
    # /metrics is as it was: Prometheus' text, for anyone who reaches the port.
    families = {f.name for f in text_string_to_metric_families(ask(watched.metrics_url)[2]
                                                               .decode())}
    assert "fabric_device_memory_resident_bytes" in families


def test_a_ticket_signs_in_once(watched):
    link = sign_in_link(dashboard_address(watched.metrics_url), watched.admin_token)
    status, headers, _ = ask(link)
    assert status == 303 and headers["Set-Cookie"].startswith(COOKIE + "=")
    assert ask(link)[0] == 401  # used


def test_fabric_dashboard_finds_it_in_the_admin_file(watched, tmp_path):
    admin_file = watched.write_admin_file(tmp_path / "admin.json")
    assert json.loads(open(admin_file).read())["metrics"] == watched.metrics_url
    result = CliRunner().invoke(main, ["dashboard", "--admin-file", admin_file,
                                       "--no-browser"], env={"FABRIC_ADMIN_TOKEN": None})
    assert result.exit_code == 0, result.output
    lines = dict(line.split(": ", 1) for line in result.output.splitlines())
    assert lines["dashboard"] == dashboard_address(watched.metrics_url)
    assert watched.admin_token not in result.output
    assert ask(lines["sign in (once, within a minute)"])[0] == 303
    refused = CliRunner().invoke(main, ["dashboard", "--admin-file", admin_file,
                                        "--token", "wrong", "--no-browser"],
                                 env={"FABRIC_ADMIN_TOKEN": None})
    assert refused.exit_code == 1 and "refused the token" in refused.output


# What the page shows, read in one script (the page redraws its rows every second: elements
# found in one call may be gone by the next).
READ_PAGE = """
const rows = table => [...document.querySelectorAll(`#${table} tbody tr`)]
  .map(row => row.dataset.device);
const memory = [...document.querySelectorAll('#devices svg[data-series="memory"]')]
  .map(plot => [plot.closest("tr").dataset.device, Number(plot.dataset.latest),
                plot.querySelector("polyline").getAttribute("points")]);
return {status: document.getElementById("status").textContent, devices: rows("devices"),
        sessions: rows("sessions"), memory: Object.fromEntries(
          memory.map(([device, latest, points]) => [device, {latest, points}]))};
"""


def shown(driver: Any) -> dict[str, Any]:
    """The page's status line, its devices' and sessions' rows (by device) and each device's
    memory plot (its newest value and its line's points)."""
    return driver.execute_script(READ_PAGE)


def test_the_page_in_a_browser(watched, tmp_path):
    missing = chromium_missing()
    if missing is not None:
        pytest.skip(f"the dashboard's browser test needs Chromium: {missing}")
    link = sign_in_link(dashboard_address(watched.metrics_url), watched.admin_token)
    with headless_chromium() as driver:
        driver.get(link)
        assert urlsplit(driver.current_url).query == ""  # (the ticket left the address)
        wait_for(lambda: shown(driver)["devices"] == ["0", "1"]
                 and shown(driver)["status"].startswith("live"), LIVE_SECONDS,
                 "both devices, live", detail=lambda: shown(driver))
        assert shown(driver)["sessions"] == []
        before = shown(driver)["memory"]["1"]["latest"]
        with watched.connect(device=1) as session:
            wait_for(lambda: shown(driver)["sessions"] == ["1"], LIVE_SECONDS,
                     "the test's session on the page", detail=lambda: shown(driver))
            points = shown(driver)["memory"]["1"]["points"]
            held = session.asarray(UPLOAD)
            session.sync()
            wait_for(lambda: shown(driver)["memory"]["1"]["latest"] >= before + UPLOAD.nbytes,
                     LIVE_SECONDS, "device 1's memory plot to show the 64 MiB",
                     detail=lambda: shown(driver)["memory"])
            assert shown(driver)["memory"]["1"]["points"] != points
            driver.save_screenshot(str(tmp_path / "dashboard.png"))
            del held
        wait_for(lambda: shown(driver)["sessions"] == [], LIVE_SECONDS,
                 "the closed session to leave the page", detail=lambda: shown(driver))
        page = driver.page_source
        assert not any(secret.decode() in page for secret in secrets_of(watched))
        assert f"{session.id:x}" not in page
    assert (tmp_path / "dashboard.png").stat().st_size > 0
