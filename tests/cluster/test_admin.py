"""End-to-end: ``fabric.Admin`` and ``fabric admin`` against real broker and worker processes.

Each command is run against a LocalCluster with its admin token; refusals (client token,
unknown session or worker) are shown to change nothing; the CLI is run as a subprocess with
``--json`` parsed and its documented exit codes checked, including an unreachable broker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rawpeers import free_tcp_address

import fabric
from fabric import Admin, LocalCluster
from fabric.core.config import write_secret_file
from fabric.core.errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    DeviceDraining,
    NotFound,
    SessionLost,
)

HEARTBEAT = 0.2


@pytest.fixture
def admin(shared_cluster):
    with Admin(shared_cluster.address, token=shared_cluster.admin_token) as opened:
        yield opened


@pytest.fixture
def clean_env(tmp_path):
    """An environment with no fabric variables and no default connection file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return env


def fabric_admin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``fabric admin ARGS`` as a user would; a generous timeout guards against hangs."""
    return subprocess.run([sys.executable, "-m", "fabric", "admin", *args], env=env,
                          capture_output=True, text=True, timeout=30)


def secrets_of(shared_cluster) -> list[str]:
    return [shared_cluster.token, shared_cluster.admin_token, shared_cluster.worker_token]


# -- the Python API ---------------------------------------------------------------------------


def test_read_commands_show_the_cluster_and_its_traffic(shared_cluster, admin):
    with shared_cluster.connect(device=1) as session:
        x = session.asarray(np.arange(1000.0))
        assert (x + 1).numpy()[-1] == 1000.0
        status = admin.status()
        assert status["server"] == admin.server
        assert (status["workers"], status["devices_online"], status["devices_total"]) == (2, 2, 2)
        assert status["sessions"] >= 1 and status["traffic"]["bytes"] >= 8000
        assert status["rates"]["messages_per_s"] > 0
        assert set(status["protocol_errors"]) == {"frontend", "workers"}
        workers = admin.workers()
        assert [(w["name"], w["backend"], w["devices"]) for w in workers] == [
            ("worker-0", "numpy", [0]), ("worker-1", "numpy", [1])]
        assert workers[1]["sessions"] >= 1 and workers[1]["submits"] >= 1
        devices = admin.devices()
        assert [(d["index"], d["worker"], d["online"]) for d in devices] == [
            (0, "worker-0", True), (1, "worker-1", True)]
        assert devices[1]["bytes"] >= 8000
        mine = [s for s in admin.sessions() if s["id"] == f"{session.id:#018x}"]
        assert len(mine) == 1
        assert (mine[0]["device"], mine[0]["worker"], mine[0]["state"]) == (1, "worker-1", "open")
        assert mine[0]["messages"] >= 2 and mine[0]["submits"] >= 1


def test_a_client_token_is_refused_and_counted(shared_cluster, admin):
    before = admin.status()["rejects"].get("admin_unauthorized", 0)
    with pytest.raises(AuthenticationError, match="admin commands need the admin token"):
        Admin(shared_cluster.address, token=shared_cluster.token)
    assert admin.status()["rejects"]["admin_unauthorized"] == before + 1


def test_close_session_makes_the_clients_next_call_raise_session_lost(shared_cluster, admin):
    with shared_cluster.connect(device=0) as session, shared_cluster.connect(device=0) as other:
        x = session.asarray(np.ones(4))
        y = other.asarray(np.ones(4))
        session.sync()
        closed = admin.close_session(f"{session.id:#x}")
        assert closed == {"session": f"{session.id:#018x}", "closed": True}
        assert f"{session.id:#018x}" not in [s["id"] for s in admin.sessions()]
        with pytest.raises(SessionLost, match="closed by an administrator"):
            x.numpy()
        assert other.sync() is None and y.numpy().tolist() == [1.0] * 4  # others go on


def test_close_session_and_drain_of_what_does_not_exist_change_nothing(admin):
    before = (admin.sessions(), [(w["name"], w["draining"]) for w in admin.workers()])
    with pytest.raises(NotFound, match="does not exist on this broker"):
        admin.close_session(0x1F2E3D4C)
    with pytest.raises(NotFound, match="No worker named 'worker-9'"):
        admin.drain("worker-9")
    after = (admin.sessions(), [(w["name"], w["draining"]) for w in admin.workers()])
    assert [s["id"] for s in after[0]] == [s["id"] for s in before[0]]
    assert after[1] == before[1]


def test_drain_refuses_new_sessions_there_while_the_existing_one_works(shared_cluster, admin):
    with shared_cluster.connect(device=1) as existing:
        x = existing.asarray(np.arange(5.0))
        drained = admin.drain("worker-1")
        try:
            assert drained == {"worker": "worker-1", "draining": True, "sessions": 1}
            with pytest.raises(DeviceDraining, match="draining"):
                shared_cluster.connect(device=1)
            assert (x * 2).numpy().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
            with shared_cluster.connect(device=0) as elsewhere:
                elsewhere.sync()
            assert [w["draining"] for w in admin.workers()] == [False, True]
            assert admin.status()["workers_draining"] == ["worker-1"]
        finally:
            admin.undrain("worker-1")
    with shared_cluster.connect(device=1) as again:
        again.sync()


def test_shutdown_stops_the_broker_and_ends_its_sessions():
    with LocalCluster(workers=1, heartbeat=HEARTBEAT) as own:
        with own.connect(device=0) as session, Admin(own.address,
                                                     token=own.admin_token) as admin:
            assert admin.shutdown() == {"server": admin.server, "stopping": True,
                                        "sessions": 1}
            assert own.broker.wait(timeout=10) == 0
            with pytest.raises(SessionLost):
                session.sync()


def test_an_unreachable_broker_is_a_connect_error():
    with pytest.raises(ConnectError, match="Nothing is listening"):
        Admin(free_tcp_address(), token="whatever", timeout=5)


def test_no_address_or_token_is_a_config_error(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith("FABRIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="No broker address"):
        Admin(token="t")
    with pytest.raises(ConfigError, match="No admin token"):
        Admin(free_tcp_address())


def test_fabric_exports_admin():
    assert fabric.Admin is Admin


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_read_commands_print_json_and_tables(shared_cluster, clean_env, tmp_path):
    token_file = tmp_path / "admin-token"
    write_secret_file(token_file, shared_cluster.admin_token)
    base = ["--address", shared_cluster.address, "--token-file", str(token_file)]
    with shared_cluster.connect(device=0) as session:
        session.sync()
        outputs = []
        for command, key in [("status", "server"), ("workers", "name"), ("devices", "index"),
                             ("sessions", "id")]:
            done = fabric_admin(*base, command, "--json", env=clean_env)
            assert done.returncode == 0, done.stderr
            parsed = json.loads(done.stdout)
            assert key in (parsed if command == "status" else parsed[0])
            table = fabric_admin(*base, command, env=clean_env)
            assert table.returncode == 0, table.stderr
            outputs += [done.stdout, done.stderr, table.stdout, table.stderr]
        assert f"{session.id:#018x}" in outputs[-2]  # the sessions table
    assert "uptime:" in outputs[2] and "worker-1" in outputs[6]
    assert not any(secret in text for text in outputs for secret in secrets_of(shared_cluster))


def test_cli_workers_table_shows_a_device_count_and_the_indexes(shared_cluster, clean_env,
                                                                tmp_path):
    # (issue 23: device indexes under a column named DEVICES made device 0 read as none)
    token_file = tmp_path / "admin-token"
    write_secret_file(token_file, shared_cluster.admin_token)
    table = fabric_admin("--address", shared_cluster.address, "--token-file", str(token_file),
                         "workers", env=clean_env)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    columns = header.split()
    assert "DEVICES" in columns and "INDEXES" in columns
    by_name = {row.split()[0]: row.split() for row in rows}
    for name, index in (("worker-0", "0"), ("worker-1", "1")):
        cells = by_name[name]
        assert cells[columns.index("DEVICES")] == "1"
        assert cells[columns.index("INDEXES")] == index


def test_cli_demo_help_says_what_it_runs():
    done = subprocess.run([sys.executable, "-m", "fabric", "demo", "--help"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    words = " ".join(done.stdout.split())
    for step in ("uploads an array", "streams 300 ops", "worker to worker", "reads the result",
                 "admin status", "stops every process"):
        assert step in words, step


def test_cli_admin_file_older_files_and_environment_give_address_and_token(
        shared_cluster, clean_env, tmp_path):
    path = tmp_path / "shared_cluster-admin.json"
    shared_cluster.write_admin_file(path)
    done = fabric_admin("--admin-file", str(path), "workers", "--json", env=clean_env)
    assert done.returncode == 0, done.stderr
    assert [w["name"] for w in json.loads(done.stdout)] == ["worker-0", "worker-1"]
    env = {**clean_env, "FABRIC_ADMIN_FILE": str(path)}
    assert fabric_admin("status", "--json", env=env).returncode == 0
    env = {**clean_env, "FABRIC_ADMIN_TOKEN": shared_cluster.admin_token}
    assert fabric_admin("--address", shared_cluster.address, "devices", env=env).returncode == 0
    # A file written before the two files (every token in one) still serves, by option or
    # variable, as it did.
    combined = tmp_path / "combined.json"
    write_secret_file(combined, json.dumps({
        "address": shared_cluster.address, "backend_address": shared_cluster.worker_address,
        "token": shared_cluster.token, "admin_token": shared_cluster.admin_token,
        "worker_token": shared_cluster.worker_token}))
    assert fabric_admin("--connection-file", str(combined), "status", env=clean_env
                        ).returncode == 0
    env = {**clean_env, "FABRIC_CONNECTION_FILE": str(combined)}
    assert fabric_admin("status", "--json", env=env).returncode == 0
    # A client's file gives the address; the admin token comes from elsewhere.
    client = shared_cluster.write_connection_file(tmp_path / "client.json")
    env = {**clean_env, "FABRIC_ADMIN_TOKEN": shared_cluster.admin_token}
    assert fabric_admin("--connection-file", client, "devices", env=env).returncode == 0


def test_cli_refusals_and_not_found_exit_1_with_one_line(shared_cluster, clean_env):
    base = ["--address", shared_cluster.address]
    env = {**clean_env, "FABRIC_ADMIN_TOKEN": shared_cluster.admin_token}
    wrong = {**clean_env, "FABRIC_ADMIN_TOKEN": shared_cluster.token}
    for args, environment, expected in [
        (["status"], wrong, "admin commands need the admin token"),
        (["close-session", "0x1f2e3d4c"], env, "does not exist on this broker"),
        (["drain", "worker-9"], env, "No worker named 'worker-9'"),
    ]:
        done = fabric_admin(*base, *args, env=environment)
        assert done.returncode == 1, (args, done.stderr)
        assert expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""
        assert not any(secret in done.stderr for secret in secrets_of(shared_cluster))


def test_cli_usage_errors_exit_2(shared_cluster, clean_env, tmp_path):
    env = {**clean_env, "FABRIC_ADMIN_TOKEN": shared_cluster.admin_token}
    assert fabric_admin("--address", shared_cluster.address, "close-session", "not-hex",
                        env=env).returncode == 2
    assert fabric_admin("--address", shared_cluster.address, "reboot", env=env).returncode == 2
    no_token = fabric_admin("--address", shared_cluster.address, "status", env=clean_env)
    assert no_token.returncode == 2 and "No admin token" in no_token.stderr
    missing = fabric_admin("--connection-file", str(tmp_path / "nope.json"), "status",
                           env=clean_env)
    assert missing.returncode == 2 and "nope.json" in missing.stderr


def test_cli_unreachable_broker_exits_3_with_a_useful_line(clean_env, tmp_path):
    address = free_tcp_address()
    done = fabric_admin("--address", address, "--token", "whatever", "status", env=clean_env)
    assert done.returncode == 3
    assert f"Nothing is listening at {address}" in done.stderr
    assert done.stderr.count("\n") == 1
    # A stale connection file: the message names it.
    stale = tmp_path / "stale.json"
    write_secret_file(stale, json.dumps({"address": address, "token": "t",
                                         "admin_token": "a"}))
    done = fabric_admin("--connection-file", str(stale), "sessions", env=clean_env)
    assert done.returncode == 3 and str(stale) in done.stderr


def test_cli_drain_close_session_and_shutdown(clean_env):
    with LocalCluster(workers=2, heartbeat=HEARTBEAT) as own:
        env = {**clean_env, "FABRIC_ADMIN_TOKEN": own.admin_token}
        base = ["--address", own.address]
        with own.connect(device=0) as session:
            session.sync()
            drained = fabric_admin(*base, "drain", "worker-1", "--json", env=env)
            assert drained.returncode == 0, drained.stderr
            assert json.loads(drained.stdout)["draining"] is True
            with pytest.raises(DeviceDraining):
                own.connect(device=1)
            closed = fabric_admin(*base, "close-session", f"{session.id:#x}", env=env)
            assert closed.returncode == 0, closed.stderr
            assert f"{session.id:#018x}" in closed.stdout
            with pytest.raises(SessionLost, match="closed by an administrator"):
                session.sync()
        done = fabric_admin(*base, "shutdown", env=env)
        assert done.returncode == 0, done.stderr
        assert "shutting down" in done.stdout
        assert own.broker.wait(timeout=10) == 0
