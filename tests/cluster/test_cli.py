"""The ``fabric`` commands' option names: one name per meaning across every command.

``--backend`` is a device backend (numpy, numexpr) wherever it appears; the address workers
connect to is ``--worker-address`` on ``fabric broker`` and ``fabric cluster up``, and
``workers`` in the broker's ready line. The old spellings (the broker's ``--backend``, cluster
up's ``--backend-address``) still work for one release, with a deprecation line on stderr.
Real processes, on free loopback ports.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fabric
from fabric.core.config import write_secret_file
from polling import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENS = {"FABRIC_TOKEN": "client-token", "FABRIC_WORKER_TOKEN": "worker-token"}


def fabric_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m fabric ARGS`` in the background, with the test's tokens (in ``env``, else
    this process's environment); the caller ends it."""
    return subprocess.Popen([sys.executable, "-m", "fabric", *args], cwd=REPO,
                            env={**(os.environ if env is None else env), **TOKENS},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def first_line(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The first line ``proc`` prints on stdout ('' if it prints none in time)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def end(proc: subprocess.Popen) -> tuple[str, str]:
    """Stop ``proc`` as Ctrl-C would (killed if it lingers) and return its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=10)


def help_of(*command: str) -> str:
    """A command's --help, its lines joined (click wraps them anywhere)."""
    done = subprocess.run([sys.executable, "-m", "fabric", *command, "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_backend_names_a_device_backend_and_worker_address_the_workers_address_everywhere():
    broker, worker, cluster_up = help_of("broker"), help_of("worker"), help_of("cluster", "up")
    assert "--worker-address" in broker and "--backend" not in broker.replace(
        "Formerly --backend", "")
    assert "--worker-address" in cluster_up and "--backend-address" not in cluster_up.replace(
        "Formerly --backend-address", "")
    for text in (worker, cluster_up):
        assert "--backend TEXT" in text and "numexpr" in text
    assert "--worker-address" in worker  # --broker's help names what it is


def test_the_brokers_ready_line_names_its_ports_frontend_and_workers():
    broker = fabric_cli("broker", "--frontend", "tcp://127.0.0.1:*",
                        "--worker-address", "tcp://127.0.0.1:*")
    try:
        ready = json.loads(first_line(broker) or "{}")
    finally:
        end(broker)
    assert set(ready) == {"ready", "frontend", "workers"}, ready
    assert ready["workers"].startswith("tcp://127.0.0.1:") and not ready["workers"].endswith("*")
    assert ready["workers"] != ready["frontend"]


def test_the_brokers_old_backend_flag_still_works_for_a_release_and_says_so():
    broker = fabric_cli("broker", "--frontend", "tcp://127.0.0.1:*",
                        "--backend", "tcp://127.0.0.1:*")
    worker = None
    try:
        ready = json.loads(first_line(broker) or "{}")
        assert ready.get("ready") == "broker", end(broker)
        worker = fabric_cli("worker", "--broker", ready["workers"], "--name", "w0",
                            "--heartbeat", "0.2")
        wait_for(lambda: fabric.devices(ready["frontend"], token=TOKENS["FABRIC_TOKEN"],
                                        timeout=5) or None, 30, "the worker to register")
    finally:
        if worker is not None:
            end(worker)
        _, err = end(broker)
    assert ("fabric broker: --backend is deprecated and goes in the next release: use "
            "--worker-address.") in err


@pytest.mark.timeout(60)
def test_a_worker_joins_with_an_older_admin_file_that_says_backend_address(tmp_path):
    with fabric.LocalCluster(workers=0, heartbeat=0.2) as cluster:
        info = json.loads(Path(cluster.write_admin_file(tmp_path / "admin.json")).read_text())
        assert info["worker_address"] == cluster.worker_address and "backend_address" not in info
        info["backend_address"] = info.pop("worker_address")  # as an older cluster up wrote it
        older = tmp_path / "older-admin.json"
        write_secret_file(older, json.dumps(info))
        # The worker token comes from the file too: none in the environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen([sys.executable, "-m", "fabric", "worker", "--admin-file",
                                       str(older), "--name", "w-older", "--heartbeat", "0.2"],
                                      cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: [d.worker for d in cluster.devices()] == ["w-older"], 30,
                     "the worker to register", detail=(tmp_path / "worker.log").read_text)
        finally:
            end(worker)


def environment_of(pid: int) -> dict[str, str]:
    """Process ``pid``'s environment as the kernel shows it (glibc 2.36 cuts GLIBC_TUNABLES
    there to its first setting, in place)."""
    pairs = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(pair.decode().split("=", 1) for pair in pairs if b"=" in pair)


@pytest.mark.timeout(60)
def test_a_broker_and_worker_started_by_hand_get_the_bulk_allocator_keeping_the_users_choice():
    from fabric.launch.local import BULK_MALLOC_STARTED, QUIET_BLAS, bulk_malloc_tunables

    bare = {k: v for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", BULK_MALLOC_STARTED, *QUIET_BLAS)}
    broker = fabric_cli("broker", "--frontend", "tcp://127.0.0.1:*",
                        "--worker-address", "tcp://127.0.0.1:*", env=bare)
    worker = None
    try:
        ready = json.loads(first_line(broker) or "{}")
        assert ready.get("ready") == "broker", end(broker)
        # (the same process, re-executed in place: a supervisor's pid stays right)
        assert environment_of(broker.pid)["GLIBC_TUNABLES"] == bulk_malloc_tunables()[0]
        worker = fabric_cli("worker", "--broker", ready["workers"], "--name", "w0",
                            "--heartbeat", "0.2",
                            env={**bare, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
        wait_for(lambda: fabric.devices(ready["frontend"], token=TOKENS["FABRIC_TOKEN"],
                                        timeout=5) or None, 30, "the worker to register")
        started = environment_of(worker.pid)
        assert started["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"  # the user's, first
        assert started[BULK_MALLOC_STARTED] == "1"  # and ours added after it
        assert started["OPENBLAS_THREAD_TIMEOUT"] == QUIET_BLAS["OPENBLAS_THREAD_TIMEOUT"]
    finally:
        if worker is not None:
            end(worker)
        end(broker)


def test_cluster_up_takes_its_old_backend_address_flag_with_a_deprecation_line(tmp_path):
    path = tmp_path / "c.json"
    proc = fabric_cli("cluster", "up", "--workers", "1", "--frontend", "tcp://127.0.0.1:*",
                      "--backend-address", "tcp://127.0.0.1:*", "--connection-file", str(path))
    try:
        wait_for(lambda: path.exists() or proc.poll() is not None, 30, "the connection file")
        with fabric.connect(connection_file=str(path), timeout=10) as session:
            assert session.arange(4).sum().numpy() == 6
    finally:
        out, err = end(proc)
    assert proc.returncode == 0, err
    assert "--backend-address is deprecated" in err and "use --worker-address" in err


@pytest.mark.parametrize("command", [("broker", "--backend"),
                                     ("cluster", "up", "--backend-address")])
def test_the_old_and_new_spelling_together_are_a_usage_error(command):
    *words, old = command
    done = subprocess.run([sys.executable, "-m", "fabric", *words, old, "tcp://127.0.0.1:*",
                           "--worker-address", "tcp://127.0.0.1:*"], cwd=REPO,
                          env={**os.environ, **TOKENS}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert f"Give --worker-address alone: {old} is its old spelling." in done.stderr
