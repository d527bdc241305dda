"""End-to-end: `fabric cluster up`, connection files, and the embedded local cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import fabric
from fabric.core.addresses import advertised
from fabric.core.errors import ConfigError, ConnectError

from conftest import child_pids, children_of
from polling import wait_for


@pytest.fixture
def cluster_up(tmp_path):
    """A `fabric cluster up` process with two workers on free ports; ended by the test."""
    path = tmp_path / "conn.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "cluster", "up", "--workers", "2",
         "--frontend", "tcp://127.0.0.1:*", "--worker-address", "tcp://127.0.0.1:*",
         "--connection-file", str(path), "--heartbeat", "0.2", "--metrics", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: path.exists() or proc.poll() is not None, 30, "the connection file")
        assert proc.poll() is None, proc.stderr.read()
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_cluster_up_serves_through_its_connection_file_and_stops_on_ctrl_c(cluster_up,
                                                                          monkeypatch):
    proc, path = cluster_up
    assert path.stat().st_mode & 0o777 == 0o600
    info = json.loads(path.read_text())
    with fabric.connect(connection_file=str(path), device=1) as session:
        assert session.device.worker == "worker-1"
        assert session.arange(10).sum().numpy() == 45
    monkeypatch.setenv("FABRIC_CONNECTION_FILE", str(path))
    assert [d.index for d in fabric.devices()] == [0, 1]
    with fabric.connect(device=0) as session:
        assert session.device.index == 0
    children = children_of(proc.pid)
    assert len(children) == 3  # a broker and two workers
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert info["address"] in out and "connection file" in out
    assert info["token"] not in out + err  # printed: where the file is, never the tokens
    assert not any(Path(f"/proc/{pid}").exists() for pid in children)
    assert not path.exists()
    # The logs stay, in a dated folder beside the connection file, named at start and stop.
    logs, = path.parent.glob("conn-logs-*")
    assert f"logs in {logs}" in out and err.rstrip().endswith(f"logs kept in {logs}")
    assert {p.name for p in logs.iterdir()} == {"broker.log", "worker-0.log", "worker-1.log"}
    assert "registered with" in (logs / "worker-1.log").read_text()
    # Workers shown as they came in, then where the broker's metrics are.
    assert err.index("worker-0 registered (1 of 2): device(s) 0") < \
        err.index("worker-1 registered (2 of 2): device(s) 1")
    metrics_url = out.split("metrics:  ", 1)[1].split()[0]
    assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")


def test_cluster_up_writes_a_connection_file_for_users_and_an_admin_file_for_operators(
        cluster_up, tmp_path):
    proc, path = cluster_up
    admin_path = tmp_path / "conn-admin.json"  # the default: beside the connection file
    assert path.stat().st_mode & 0o777 == 0o600
    assert admin_path.stat().st_mode & 0o777 == 0o600
    operators = json.loads(admin_path.read_text())
    secrets = [operators["admin_token"], operators["worker_token"]]
    assert not any(secret in path.read_text() for secret in secrets)
    assert json.loads(path.read_text())["token"] not in admin_path.read_text()
    with fabric.connect(connection_file=str(path), timeout=10) as session:
        assert session.arange(4).sum().numpy() == 6
    with pytest.raises(ConfigError, match="admin file, not a connection file"):
        fabric.connect(connection_file=str(admin_path), timeout=10)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-defaults")

    def fabric_admin(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fabric", "admin", *args, "status"],
                              env={**env, **extra_env}, capture_output=True, text=True,
                              timeout=30)

    for done in (fabric_admin("--admin-file", str(admin_path)),
                 fabric_admin(FABRIC_ADMIN_FILE=str(admin_path))):
        assert done.returncode == 0, done.stderr
        assert "devices:" in done.stdout
    # The users' file is no key to admin: exit 2 (usage: no admin token), saying why.
    for done in (fabric_admin("--connection-file", str(path)),
                 fabric_admin(FABRIC_CONNECTION_FILE=str(path))):
        assert done.returncode == 2, done.stderr
        assert "client's connection file: it holds no admin token" in done.stderr
        assert "--admin-file" in done.stderr and done.stderr.count("\n") == 1
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert f"connection file (hand this one to users): {path}" in out
    assert f"admin file (operators only: admin and worker tokens): {admin_path}" in out
    assert not any(secret in out + err for secret in secrets)
    assert not path.exists() and not admin_path.exists()


def test_children_stop_when_the_launcher_is_killed(cluster_up):
    proc, path = cluster_up
    children = wait_for(lambda: children_of(proc.pid) if len(children_of(proc.pid)) == 3
                          else None, 10, "three children")
    proc.kill()
    proc.wait(10)
    wait_for(lambda: not any(Path(f"/proc/{pid}/stat").exists()
                               and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
                               for pid in children), 10, "the orphaned children to stop")
    logs, = path.parent.glob("conn-logs-*")  # what a killed launcher leaves: the logs
    assert (logs / "broker.log").exists()


def test_cluster_up_keeps_its_logs_in_log_dir_and_says_where_on_each_exit(tmp_path):
    logs = tmp_path / "logs" / "today"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabric", "cluster", "up", "--workers", "1",
         "--frontend", "tcp://127.0.0.1:*", "--worker-address", "tcp://127.0.0.1:*",
         "--connection-file", str(tmp_path / "c.json"), "--log-dir", str(logs)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "c.json").exists() or proc.poll() is not None, 30,
                 "the connection file")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert f"logs in {logs}" in out and err.rstrip().endswith(f"logs kept in {logs}")
    assert "stopped by SIGTERM" in err
    assert "broker serving clients" in (logs / "broker.log").read_text()
    assert not list(tmp_path.glob("c-logs-*"))  # --log-dir replaces the default folder


def test_cluster_up_on_a_port_in_use_fails_with_one_clear_line(tmp_path):
    with fabric.LocalCluster(workers=0) as taken:
        port = taken.address.rsplit(":", 1)[1]
        result = subprocess.run(
            [sys.executable, "-m", "fabric", "cluster", "up", "--frontend",
             f"tcp://127.0.0.1:{port}", "--worker-address", "tcp://127.0.0.1:*",
             "--connection-file", str(tmp_path / "c.json")],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Address already in use" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()
    logs, = tmp_path.glob("c-logs-*")  # the line names the logs, which are kept
    assert f"(logs in {logs})" in result.stderr
    assert "Address already in use" in (logs / "broker.log").read_text()


def test_a_stale_connection_file_names_itself(tmp_path):
    with fabric.LocalCluster(workers=0) as gone:
        path = gone.write_connection_file(tmp_path / "stale.json")
    started = time.monotonic()
    with pytest.raises(ConnectError, match="stale"):
        fabric.connect(connection_file=path, timeout=10)
    assert time.monotonic() - started < 2


def test_connection_files_readable_by_others_or_malformed_are_refused(tmp_path):
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps({"address": "tcp://127.0.0.1:1", "token": "t"}))
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        fabric.connect(connection_file=str(loose))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    garbage.chmod(0o600)
    with pytest.raises(ConfigError, match="not a fabric connection file"):
        fabric.connect(connection_file=str(garbage))
    with pytest.raises(ConfigError, match="Cannot read"):
        fabric.connect(connection_file=str(tmp_path / "missing.json"))


def test_connect_with_nothing_named_runs_an_embedded_cluster_and_stops_it():
    script = (
        "import os, fabric\n"
        "os.environ.pop('FABRIC_CONNECTION_FILE', None)\n"
        "s = fabric.connect()\n"
        "print(s.device_count, s.arange(4).sum().numpy())\n"
        "s.close()\n"
        "import fabric.launch.local as c\n"
        "print(c._embedded is None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FABRIC_CONNECTION_FILE"}
    before = child_pids()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    count, total, stopped = result.stdout.split()
    assert int(count) == (os.cpu_count() or 1) and int(total) == 6 and stopped == "True"
    assert child_pids() == before


def test_brokers_and_workers_start_with_bulk_malloc_and_quiet_blas_unless_told_otherwise(monkeypatch):
    from fabric.launch.local import bulk_malloc_tunables, with_bulk_malloc

    ours = ":".join(bulk_malloc_tunables())
    assert with_bulk_malloc({})["GLIBC_TUNABLES"] == ours
    assert with_bulk_malloc({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"})[
        "GLIBC_TUNABLES"] == f"glibc.malloc.tcache_count=0:{ours}"
    # an operator's choice stands, setting by setting
    assert with_bulk_malloc({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=4"})[
        "GLIBC_TUNABLES"] == ("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=4:"
                              "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "8")  # an operator's choice, kept
    with fabric.LocalCluster(workers=1) as cluster:
        assert cluster._env()["GLIBC_TUNABLES"] == ours
        for proc in (cluster.broker, *cluster.workers):
            # (glibc 2.36 cuts the string it has parsed to its first setting, in place)
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            assert any(e.startswith(f"GLIBC_TUNABLES={bulk_malloc_tunables()[0]}".encode())
                       for e in environ)
            assert b"OPENBLAS_THREAD_TIMEOUT=8" in environ


@pytest.mark.parametrize("pays", [True, False])
def test_the_heap_takes_huge_pages_only_where_this_hosts_memory_pays_them(monkeypatch, pays):
    from fabric.core import cross_memory
    from fabric.launch.local import BULK_MALLOC_TUNABLES, bulk_malloc_tunables

    monkeypatch.setattr(cross_memory, "huge_pages_pay", lambda: pays)
    assert bulk_malloc_tunables() == (f"glibc.malloc.hugetlb={int(pays)}",
                                      *BULK_MALLOC_TUNABLES)


@pytest.mark.parametrize("address, host, expected", [
    ("tcp://127.0.0.1:5555", None, "tcp://127.0.0.1:5555"),
    ("tcp://0.0.0.0:5555", "node7.example", "tcp://node7.example:5555"),
    ("tcp://[::]:5555", "10.0.0.7", "tcp://10.0.0.7:5555"),
    ("ipc:///tmp/fabric", "node7", "ipc:///tmp/fabric"),
])
def test_an_advertised_address_keeps_the_bound_port(address, host, expected):
    assert advertised(address, host) == expected


@pytest.mark.parametrize("address", ["tcp://0.0.0.0:5555", "tcp://[::]:1", "tcp://*:5555"])
def test_a_wildcard_bind_address_is_never_written_for_clients(address):
    with pytest.raises(ConfigError, match="--advertise"):
        advertised(address, None)


def test_cluster_up_bound_to_every_interface_writes_the_advertised_host(tmp_path):
    client_file = tmp_path / "cluster.json"
    args = [sys.executable, "-m", "fabric", "cluster", "up", "--workers", "1",
            "--frontend", "tcp://0.0.0.0:*", "--worker-address", "tcp://0.0.0.0:*",
            "--connection-file", str(client_file), "--heartbeat", "0.2"]
    refused = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "--advertise" in refused.stderr
    assert not client_file.exists()
    launcher = subprocess.Popen([*args, "--advertise", "127.0.0.1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        wait_for(client_file.exists, 30, "the connection file")
        address = json.loads(client_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":*")
        with fabric.connect(connection_file=str(client_file), timeout=5) as session:
            assert session.arange(4).sum().numpy() == 6
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.communicate(timeout=30)


def test_local_clusters_old_backend_address_still_works_for_a_release_and_warns():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new name: no warning
        assert fabric.LocalCluster(workers=0).worker_address == "tcp://127.0.0.1:*"
    with pytest.warns(DeprecationWarning, match=r"backend_address=\.\.\.\) is deprecated.* "
                      "use worker_address") as caught:
        cluster = fabric.LocalCluster(workers=0, backend_address="tcp://127.0.0.1:*")
    assert caught[0].filename == __file__  # the caller's line, not the launcher's
    with cluster:
        bound = cluster.worker_address
        assert bound.startswith("tcp://127.0.0.1:") and not bound.endswith("*")
        with pytest.warns(DeprecationWarning, match="LocalCluster.backend_address is "
                          "deprecated.* use worker_address") as caught:
            assert cluster.backend_address == bound
        assert caught[0].filename == __file__
        with pytest.raises(AttributeError):  # read-only: the cluster's own is worker_address
            cluster.backend_address = "tcp://127.0.0.1:1"
    with pytest.raises(TypeError, match="Give worker_address alone"):
        fabric.LocalCluster(workers=0, worker_address="tcp://127.0.0.1:5556",
                            backend_address="tcp://127.0.0.1:*")


def test_workers_hold_their_thread_pools_to_a_share_of_the_cores():
    # numexpr reports its own pool's size: what --threads set, not what was asked
    with fabric.LocalCluster(workers=1, backend="numexpr",
                             worker_args=("--threads", "3")) as cluster:  # (the last wins)
        assert cluster.devices()[0].settings["threads"] == 3
        with cluster.connect() as session:
            assert (session.ones((300, 300)) @ session.ones((300, 300))).numpy()[0, 0] == 300
    with fabric.LocalCluster(workers=2, backend="numexpr") as cluster:
        share = cluster.threads_per_worker()
        assert share == max(1, len(os.sched_getaffinity(0)) // 2)
        assert [d.settings["threads"] for d in cluster.devices()] == [share, share]
