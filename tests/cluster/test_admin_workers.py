"""``fabric admin workers`` shows where each worker is and which were lost, and when (issue 24
section 2), end to end: a real broker, real workers, one killed, the real CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from conftest import HEARTBEAT
from polling import wait_for

from fabric import LocalCluster

pytestmark = pytest.mark.timeout(90)


def _admin_workers(cluster: LocalCluster, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env["FABRIC_ADMIN_TOKEN"] = cluster.admin_token
    done = subprocess.run([sys.executable, "-m", "fabric", "admin", "--address",
                           cluster.address, "workers", *args],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_workers_shows_host_and_address_and_a_killed_worker_as_lost_since_then():
    started = datetime.now(timezone.utc).replace(microsecond=0)  # (lost_at is to the second)
    with LocalCluster(workers=2, heartbeat=HEARTBEAT) as cluster:
        rows = json.loads(_admin_workers(cluster, "--json"))
        assert [(r["name"], r["online"], r["host"], r["address"]) for r in rows] == [
            ("worker-0", True, socket.gethostname(), "127.0.0.1"),
            ("worker-1", True, socket.gethostname(), "127.0.0.1")]

        cluster.workers[1].send_signal(signal.SIGKILL)
        cluster.workers[1].wait(timeout=10)

        def noticed() -> bool:
            rows[:] = json.loads(_admin_workers(cluster, "--json"))
            return [r["online"] for r in rows] == [True, False]
        wait_for(noticed, 30, "the broker to list worker-1 lost", interval=0.1,
                 detail=lambda: rows)
        # One still connected; the killed one lost, its host, address and index kept.
        online, lost = rows
        assert online["name"] == "worker-0" and online["online"]
        assert (lost["name"], lost["online"], lost["host"], lost["address"],
                lost["devices"]) == ("worker-1", False, socket.gethostname(), "127.0.0.1", [1])
        # Last heard from while it ran: in this test, before now.
        assert started <= datetime.fromisoformat(lost["lost_at"]) <= datetime.now(timezone.utc)
        assert lost["lost_ago"] >= 0

        table = _admin_workers(cluster)
        connected, _, gone = table.partition("lost workers")
        assert "worker-0" in connected and "127.0.0.1" in connected
        assert "worker-1" not in connected
        header, row = gone.splitlines()[1:3]
        assert header.split()[:4] == ["NAME", "HOST", "ADDRESS", "INDEXES"]
        assert row.split()[:4] == ["worker-1", socket.gethostname(), "127.0.0.1", "1"]
        assert f"{lost['lost_at'][:16]}" in row and "ago)" in row
