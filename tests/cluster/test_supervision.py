"""A worker that dies under ``fabric cluster up`` is restarted (issue 30, High 3), at most a
bounded number of times, and the rest of the cluster serves on; real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import HEARTBEAT, children_of
from polling import wait_for

import fabric
from fabric import LocalCluster
from fabric.core.errors import FabricError
from fabric.launch.supervision import RestartLimit


def test_restart_limit_allows_count_restarts_per_window():
    limit = RestartLimit(count=2, window=10.0)
    assert limit.allow(0.0) and limit.allow(1.0)
    assert not limit.allow(2.0)  # a third within 10 s
    assert limit.allow(10.5)  # the first has left the window
    assert not limit.allow(10.6)


def _worker_pid(launcher: int, name: str) -> int | None:
    for pid in children_of(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and name.encode() in argv:
            return pid
    return None


def _opens(connection_file: Path, device: int):
    def attempt():
        try:
            with fabric.connect(connection_file=str(connection_file), device=device,
                                timeout=2.0) as session:
                return session.arange(4).sum().numpy() == 6
        except FabricError:
            return False
    return attempt


@pytest.mark.parametrize("max_restarts", [None, 0], ids=["default", "never"])
def test_a_killed_worker_is_restarted_by_cluster_up_and_the_others_serve_on(tmp_path,
                                                                            max_restarts):
    client_file, admin_file = tmp_path / "cluster.json", tmp_path / "admin.json"
    said = tmp_path / "launcher.err"  # what the launcher reports, read while it runs
    with open(said, "wb") as stderr:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "fabric", "cluster", "up", "--workers", "2",
             "--frontend", "tcp://127.0.0.1:*", "--worker-address", "tcp://127.0.0.1:*",
             "--connection-file", str(client_file), "--admin-file", str(admin_file),
             "--heartbeat", str(HEARTBEAT),
             *(("--max-restarts", str(max_restarts)) if max_restarts is not None else ())],
            stdout=subprocess.DEVNULL, stderr=stderr)
    expected = "stays down" if max_restarts == 0 else "restarting it"
    try:
        wait_for(client_file.exists, 30, "the connection file", interval=0.1)
        before = fabric.devices(connection_file=str(client_file))
        with fabric.connect(connection_file=str(client_file), device=1) as survivor:
            kept = survivor.arange(10)
            os.kill(wait_for(lambda: _worker_pid(launcher.pid, "worker-0"), 30,
                             "worker-0's process", interval=0.1), signal.SIGKILL)
            wait_for(lambda: expected in said.read_text(), 30,
                     f"the launcher to say {expected!r}", interval=0.1, detail=said.read_text)
            if max_restarts != 0:  # restarted, registered again (and says so), serving
                wait_for(_opens(client_file, 0), 30, "device 0 to serve again", interval=0.1)
                wait_for(lambda: "worker-0 registered again" in said.read_text(), 30,
                         "the launcher to say worker-0 registered again", interval=0.1,
                         detail=said.read_text)
            assert kept.sum().numpy() == 45  # worker-1's session never noticed
        after = fabric.devices(connection_file=str(client_file))
        if max_restarts == 0:  # left down (no process of it), the other worker serving
            assert _worker_pid(launcher.pid, "worker-0") is None
            assert "worker-1" in [d.worker for d in after]
        else:
            assert [(d.index, d.worker) for d in after] == [(d.index, d.worker) for d in before]
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
    assert "worker-0 was killed by SIGKILL (exit code -9)" in said.read_text()


def test_a_worker_in_a_crash_loop_stays_down_after_the_bound():
    reports: list[str] = []
    stop = threading.Event()

    def crash_loop() -> None:  # every process started as worker-0 dies at once
        while not stop.is_set():
            proc = cluster.workers[0]
            if proc.poll() is None:
                proc.kill()
            time.sleep(0.05)

    with LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster:
        killer = threading.Thread(target=crash_loop)
        killer.start()
        try:
            reason = cluster.watch(poll=0.05, restarts=2, window=60.0, report=reports.append)
        finally:
            stop.set()
            killer.join()
    assert reason == "every worker stays down after restarting too often"
    assert [r.endswith("restarting it") for r in reports] == [True, True, False]
    assert "restarted 2 times in 60 s, so it stays down" in reports[-1]


@pytest.mark.parametrize("budget", ["lots"])
def test_cluster_up_refuses_a_bad_budget_as_usage(budget, tmp_path):
    run = subprocess.run([sys.executable, "-m", "fabric", "cluster", "up", "--memory-budget",
                          budget, "--connection-file", str(tmp_path / "c.json")],
                         capture_output=True, timeout=60)
    assert run.returncode == 2 and b"--memory-budget" in run.stderr
