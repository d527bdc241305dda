"""Workers on other hosts over SSH (issue 24, sections 3 and 4): the host list and the
commands, unit by unit; then the launcher end to end on simulated hosts (network namespaces
on a bridge, each running OpenSSH's sshd: ``tests/simhosts.py``), with real ssh, brokers and
workers. The remote python is this checkout's, since the hosts share this filesystem.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fabric
from fabric.core.addresses import only_this_host
from fabric.core.errors import ClusterError, ConfigError
from fabric.core.security import generate_keys
from fabric.launch.ssh import (CONNECT_TIMEOUT, Host, SSHCluster, budget_share, parse_host,
                               parse_hosts, ssh_command)

import simhosts
from conftest import HEARTBEAT, children_of
from polling import wait_for

# -- the host list and the commands, sans I/O -----------------------------------------------


@pytest.mark.parametrize("entry, expected", [
    ("node1", Host("node1")),
    ("alice@node1", Host("node1", user="alice")),
    ("alice@node1:2222 workers=4 python=/opt/venv/bin/python",
     Host("node1", "alice", 2222, 4, "/opt/venv/bin/python")),
    ("10.0.0.7:22", Host("10.0.0.7", port=22)),
    ("[fe80::1]:2200 workers=2", Host("fe80::1", port=2200, workers=2)),
    ("fe80::1", Host("fe80::1")),
])
def test_a_host_entry_names_user_host_port_and_settings(entry, expected):
    assert parse_host(entry) == expected


@pytest.mark.parametrize("entry, says", [
    ("node1:ssh", "port must be a number"),
    ("node1:70000", "port must be a number"),
    ("node1 workers=0", "workers= takes a whole number"),
    ("node1 workers=two", "workers= takes a whole number"),
    ("node1 cores=4", "write workers=N or python=PATH"),
    ("node1 python=", "write workers=N or python=PATH"),
    ("-oProxyCommand=evil", "names no host"),
    ("alice@", "names no host"),
    ("  ", "An empty host entry"),
])
def test_a_bad_host_entry_says_what_to_write(entry, says):
    with pytest.raises(ConfigError, match=says):
        parse_host(entry)


def test_a_host_file_and_a_comma_list_say_the_same():
    hostfile = "# the rack\nnode1 workers=3\n\nbob@node2:2222  # the spare\n"
    assert parse_hosts(hostfile) == parse_hosts("node1 workers=3, bob@node2:2222") == [
        Host("node1", workers=3), Host("node2", "bob", 2222)]
    with pytest.raises(ConfigError, match="node1 listed more than once"):
        parse_hosts("node1,alice@node1")
    with pytest.raises(ConfigError, match="No hosts given"):
        parse_hosts("# nobody yet\n")


def test_the_users_ssh_options_come_first_so_that_they_win():
    command = ssh_command(Host("node1", "alice", 2222), "true", config="/etc/cfg",
                          options=["ConnectTimeout=30"])
    assert command == ["ssh", "-T", "-F", "/etc/cfg", "-o", "ConnectTimeout=30",
                       "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
                       "-p", "2222", "-l", "alice", "--", "node1", "true"]


def test_the_command_that_starts_a_remote_worker_holds_no_token(tmp_path):
    cluster = SSHCluster(parse_hosts("node1 python=/opt/py, node2"), workers_per_host=2,
                         remote_python="/usr/bin/python3", log_dir=tmp_path,
                         memory_budget="40%", advertise="head")
    cluster.worker_address = "tcp://0.0.0.0:7001"  # (as the broker's ready line sets it)
    commands = [cluster.worker_command(i) for i in range(4)]
    assert [cluster.worker_name(i) for i in range(4)] == [
        "worker-0@node1", "worker-1@node1", "worker-0@node2", "worker-1@node2"]
    remote = commands[1][-1]
    assert remote.startswith("exec env PYTHONUNBUFFERED=1 GLIBC_TUNABLES=")
    assert " OPENBLAS_THREAD_TIMEOUT=4 " in remote  # (its idle threads asleep at once)
    assert "/opt/py -m fabric worker --broker tcp://head:7001" in remote
    assert "--name worker-1@node1" in remote and remote.endswith(
        "--memory-budget 20% --worker-token-file - --stop-on-stdin-close")
    assert "/usr/bin/python3 -m fabric worker" in commands[2][-1]
    tokens = (cluster.token, cluster.worker_token, cluster.admin_token)
    assert not any(token in word for command in commands for word in command
                   for token in tokens)


@pytest.mark.parametrize("budget, workers, share", [("50%", 2, "25%"), ("60%", 4, "15%"),
                                                    ("2G", 2, str(2**30))])
def test_each_worker_of_a_host_gets_its_share_of_the_budget(budget, workers, share):
    assert budget_share(budget, workers) == share


@pytest.mark.parametrize("address, only_here", [
    ("tcp://127.0.0.1:5556", True), ("tcp://localhost:5556", True), ("tcp://[::1]:5", True),
    ("ipc:///tmp/broker", True), ("tcp://10.1.2.3:5556", False),
    ("tcp://head-node:5556", False),
])
def test_an_address_only_this_host_reaches_is_told_apart(address, only_here):
    assert only_this_host(address) is only_here


# -- what fabric worker and cluster up take for it, on this machine ---------------------------


def test_a_worker_takes_its_token_on_stdin_and_stops_when_stdin_closes(cluster):
    worker = subprocess.Popen(
        [sys.executable, "-m", "fabric", "worker", "--broker", cluster.worker_address,
         "--name", "over-ssh", "--heartbeat", str(HEARTBEAT), "--worker-token-file", "-",
         "--stop-on-stdin-close"],
        stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")})
    try:
        worker.stdin.write(cluster.worker_token + "\n")
        worker.stdin.flush()
        wait_for(lambda: "over-ssh" in {d.worker for d in cluster.devices()}, 30,
                 "the worker to register with the token from its stdin")
        worker.stdin.close()
        assert worker.wait(15) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)


def _cluster_up(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", "cluster", "up", *args],
                          capture_output=True, text=True, timeout=30, env=env)


def test_cluster_up_with_hosts_refuses_addresses_the_hosts_cannot_reach(tmp_path):
    files = ["--connection-file", str(tmp_path / "c.json")]
    loopback = _cluster_up("--hosts", "node1", "--worker-address", "tcp://127.0.0.1:5556",
                           "--advertise", "head", *files)
    assert loopback.returncode == 2
    assert "Workers on other hosts cannot reach tcp://127.0.0.1:5556 as head" in loopback.stderr
    told_loopback = _cluster_up("--hosts", "node1", "--advertise", "localhost", *files)
    assert told_loopback.returncode == 2
    assert "cannot reach tcp://0.0.0.0:5556 as localhost" in told_loopback.stderr
    unnamed = _cluster_up("--hosts", "node1", *files)  # binds every interface: which host?
    assert unnamed.returncode == 2 and "--advertise" in unnamed.stderr
    both = _cluster_up("--hosts", "node1", "--hostfile", __file__, *files)
    assert both.returncode == 2 and "not both" in both.stderr
    bad = _cluster_up("--hosts", "node1:ssh", "--advertise", "head", *files)
    assert bad.returncode == 2 and "port must be a number" in bad.stderr
    no_ssh = _cluster_up("--hosts", "node1", "--advertise", "head", *files,
                         env={**os.environ, "PATH": str(tmp_path / "nothing-here")})
    assert no_ssh.returncode == 2 and "apt-get install openssh-client" in no_ssh.stderr
    assert not (tmp_path / "c.json").exists()


# -- on simulated hosts ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Three simulated hosts with sshd, removed after the module: the first two for the
    launches, the third for the test that cuts its link."""
    reason = simhosts.missing()
    if reason:
        pytest.skip(reason)
    with simhosts.simulated_hosts(tmp_path_factory.mktemp("hosts"), 3) as made:
        yield made


def _ssh_cluster(hosts: simhosts.SimulatedHosts, entries: str, **options) -> SSHCluster:
    return SSHCluster(parse_hosts(entries), remote_python=sys.executable,
                      ssh_config=str(hosts.ssh_config), worker_address="tcp://0.0.0.0:*",
                      advertise=hosts.bridge_address, heartbeat=HEARTBEAT, **options)


@pytest.fixture(scope="module")
def launched(hosts):
    """Two workers on each simulated host, launched over SSH for the whole module."""
    with _ssh_cluster(hosts, ",".join(hosts.addresses[:2]), workers_per_host=2) as running:
        yield running


def _remote_workers(hosts: simhosts.SimulatedHosts, host: int) -> list[int]:
    """The fabric worker processes running on a simulated host."""
    found = []
    for pid in hosts.pids(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # ended meanwhile
        if argv[1:4] == [b"-m", b"fabric", b"worker"]:
            found.append(pid)
    return found


def test_each_host_runs_its_workers_and_no_token_is_in_sight(launched, hosts):
    assert sorted(d.worker for d in launched.devices()) == sorted(
        f"worker-{k}@{address}" for address in hosts.addresses[:2] for k in (0, 1))
    tokens = [t.encode() for t in (launched.token, launched.worker_token,
                                   launched.admin_token)]
    for host in (0, 1):
        workers = _remote_workers(hosts, host)
        assert len(workers) == 2
        for pid in workers:  # neither on its command line nor in its environment
            seen = (Path(f"/proc/{pid}/cmdline").read_bytes()
                    + Path(f"/proc/{pid}/environ").read_bytes())
            assert not any(token in seen for token in tokens)
    for log in Path(launched.log_dir).iterdir():
        assert not any(token in log.read_bytes() for token in tokens), log


def test_compute_on_every_host_matches_numpy(launched):
    rng = np.random.default_rng(24)
    for device in launched.devices():
        a, b = rng.random((64, 32)), rng.random((32, 16))
        with launched.connect(device=device.index) as session:
            x, y = session.asarray(a), session.asarray(b)
            got = ((x @ y).sum(axis=0) / 2 + np.sin(x[0, :16])).numpy()
        np.testing.assert_allclose(got, (a @ b).sum(axis=0) / 2 + np.sin(a[0, :16]))


def test_a_tensor_moves_between_hosts(launched, hosts):
    on = {d.worker: d.index for d in launched.devices()}
    first, second = (on[f"worker-0@{address}"] for address in hosts.addresses[:2])
    values = np.arange(12.0).reshape(3, 4)
    with launched.connect(device=first) as here, launched.connect(device=second) as there:
        moved = (here.asarray(values) * 2).to(there)
        assert moved.session is there
        np.testing.assert_array_equal((moved + 1).numpy(), values * 2 + 1)


def test_a_dropped_ssh_session_stops_its_remote_worker(hosts):
    others = set(_remote_workers(hosts, 0))  # (the module's cluster's)
    with _ssh_cluster(hosts, hosts.addresses[0]) as running:
        worker, = set(_remote_workers(hosts, 0)) - others
        running.workers[0].kill()  # the launcher's SSH session ends without a word
        running.workers[0].wait()
        wait_for(lambda: not Path(f"/proc/{worker}").exists(), 15,
                 "the remote worker to stop once its standard input closed")


def test_an_unreachable_host_is_named_with_sshs_reason(hosts, tmp_path):
    unreachable = _ssh_cluster(hosts, hosts.unused_address, log_dir=tmp_path,
                               ssh_options=["ConnectTimeout=3"], start_timeout=20)
    with pytest.raises(ClusterError) as refused:
        unreachable.start()
    message = refused.value.message
    assert f"worker-0@{hosts.unused_address} exited with code 255" in message
    assert f"connect to host {hosts.unused_address} port 22" in message


def test_a_host_with_another_fabric_release_is_refused_naming_both(hosts, tmp_path):
    # A host whose fabric drifted: its interpreter loads a fabric that says another release.
    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(
        "import fabric.core.version as v\nv.__version__ = '0.0.1'\n")
    python = tmp_path / "older-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={skew} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    others = set(_remote_workers(hosts, 1))  # (the module's cluster's)
    older = _ssh_cluster(hosts, f"{hosts.addresses[1]} python={python}", log_dir=tmp_path)
    with pytest.raises(ClusterError) as refused:
        older.start()
    message = refused.value.message
    assert f"worker-0@{hosts.addresses[1]} exited with code 1" in message
    assert f"fabric 0.0.1 and this broker fabric {fabric.__version__}" in message
    assert set(_remote_workers(hosts, 1)) == others


class Launcher:
    """A ``fabric cluster up`` over SSH to the simulated hosts, in a terminal's process group
    of its own, and what the hosts ran before it."""

    def __init__(self, hosts: simhosts.SimulatedHosts, work: Path, *placement: str) -> None:
        self.hosts = hosts
        self.work = work
        self.connection_file = work / "cluster.json"
        self.before = [set(_remote_workers(hosts, host)) for host in (0, 1)]
        self.sshd_before = [hosts.pids(host) for host in (0, 1)]
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fabric", "cluster", "up", *placement,
             "--advertise", hosts.bridge_address, "--remote-python", sys.executable,
             "--ssh-config", str(hosts.ssh_config), "--frontend", "tcp://0.0.0.0:*",
             "--worker-address", "tcp://0.0.0.0:*", "--connection-file",
             str(self.connection_file), "--heartbeat", str(HEARTBEAT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        wait_for(lambda: self.connection_file.exists() or self.proc.poll() is not None, 60,
                 "the connection file")
        assert self.proc.poll() is None, self.proc.communicate(timeout=10)
        self.launch_seconds = time.monotonic() - started

    def workers(self, host: int) -> set[int]:
        """The fabric workers this launcher runs on ``host``."""
        return set(_remote_workers(self.hosts, host)) - self.before[host]

    def ssh_clients(self) -> list[int]:
        """The launcher's ssh processes, one per worker."""
        return [pid for pid in children_of(self.proc.pid)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ssh\0")]

    def stopped_leaving_nothing(self) -> None:
        """Every process the launch made on the hosts ends, sshd's sessions included."""
        for host in (0, 1):
            wait_for(lambda: self.hosts.pids(host) <= self.sshd_before[host], 15,
                     f"host {host} to have no process of this launch left")

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=10)


@pytest.fixture
def launcher(hosts, tmp_path):
    """Starts ``Launcher``s; ends what is left of them after the test."""
    started: list[Launcher] = []

    def start(*placement: str) -> Launcher:
        started.append(Launcher(hosts, tmp_path, *placement))
        return started[-1]

    yield start
    for each in started:
        each.end()


@pytest.mark.timeout(120)
def test_cluster_up_over_ssh_serves_and_ctrl_c_leaves_nothing_on_any_host(launcher, hosts,
                                                                         tmp_path):
    # The README's "More than one machine" commands, with the simulated hosts' addresses
    # and the ssh config and python that reach them.
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# two hosts, two workers each\n{hosts.addresses[0]} workers=2\n"
                        f"{hosts.addresses[1]}\n")
    running = launcher("--hostfile", str(hostfile), "--workers", "2")
    print(f"cluster up over ssh, 2 hosts x 2 workers: {running.launch_seconds:.2f} s")
    connection_file = str(running.connection_file)
    info = json.loads(running.connection_file.read_text())
    assert info["address"].startswith(f"tcp://{hosts.bridge_address}:")
    devices = fabric.devices(connection_file=connection_file, timeout=5)
    assert len(devices) == 4
    for device in devices:
        with fabric.connect(connection_file=connection_file, device=device.index) as session:
            assert session.arange(10).sum().numpy() == 45
    assert [len(running.workers(host)) for host in (0, 1)] == [2, 2]
    os.killpg(running.proc.pid, signal.SIGINT)  # Ctrl-C in the launcher's terminal
    out, err = running.proc.communicate(timeout=30)
    assert running.proc.returncode == 0, err
    assert "stopped by SIGINT" in err
    running.stopped_leaving_nothing()
    assert not running.connection_file.exists()
    logs, = tmp_path.glob("cluster-logs-*")
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        ["broker.log"] + [f"worker-{k}@{address}.log" for address in hosts.addresses[:2]
                          for k in (0, 1)])
    assert "registered with" in (logs / f"worker-1@{hosts.addresses[1]}.log").read_text()
    assert info["token"] not in out + err


@pytest.mark.timeout(120)
def test_a_worker_whose_session_drops_is_started_again_on_its_host(launcher, hosts):
    running = launcher("--hosts", ",".join(hosts.addresses[:2]), "--workers", "1")
    connection_file = str(running.connection_file)
    indexes = {d.worker: d.index for d in fabric.devices(connection_file=connection_file)}
    lost, = running.workers(1)
    ssh = next(pid for pid in running.ssh_clients()
               if hosts.addresses[1].encode() in Path(f"/proc/{pid}/cmdline").read_bytes())
    os.kill(ssh, signal.SIGKILL)  # its SSH session drops
    wait_for(lambda: not Path(f"/proc/{lost}").exists(), 15, "the cut-off worker to stop")
    wait_for(lambda: running.workers(1), 30, "a new worker on the host")
    name = f"worker-0@{hosts.addresses[1]}"
    wait_for(lambda: name in {d.worker for d in fabric.devices(
        connection_file=connection_file)}, 30, "the new worker to register")
    with fabric.connect(connection_file=connection_file, device=indexes[name]) as session:
        assert session.device.worker == name  # its index came back with its name
        assert session.arange(4).sum().numpy() == 6
    os.killpg(running.proc.pid, signal.SIGINT)
    _, err = running.proc.communicate(timeout=30)
    assert f"{name} was killed by SIGKILL (exit code -9)" in err and "restarting it" in err, err
    running.stopped_leaving_nothing()


@pytest.mark.timeout(120)
def test_a_killed_launcher_leaves_nothing_on_any_host(launcher, hosts):
    running = launcher("--hosts", ",".join(hosts.addresses[:2]), "--workers", "1")
    assert [len(running.workers(host)) for host in (0, 1)] == [1, 1]
    running.proc.kill()  # no Ctrl-C, no cleanup: its ssh clients are told by the kernel
    running.proc.wait(10)
    running.stopped_leaving_nothing()


def test_curve_reaches_the_remote_workers_through_the_same_key_folder(hosts, tmp_path):
    generate_keys(tmp_path / "keys")
    with _ssh_cluster(hosts, hosts.addresses[0], curve=tmp_path / "keys") as running:
        with running.connect() as session:
            assert session.arange(5).sum().numpy() == 10


CUT_SECONDS = 20.0  # how long the link stays down (issue 24)


@pytest.mark.timeout(180)
def test_a_host_cut_off_for_20_s_comes_back_with_its_indexes(hosts):
    # The third host, which no other test uses: its link to the bridge goes down, then up.
    with _ssh_cluster(hosts, hosts.addresses[2]) as running:
        index, = [d.index for d in running.devices()]
        with running.connect(device=index) as session:
            kept = session.arange(10)
            session.sync()
            hosts.set_link(2, up=False)
            cut = time.monotonic()
            try:
                with pytest.raises(fabric.SessionLost):
                    (kept + 1).numpy()
                print(f"link down: SessionLost after {time.monotonic() - cut:.2f} s "
                      f"(heartbeat {HEARTBEAT} s)")
                time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut)))
            finally:
                hosts.set_link(2, up=True)
        back = time.monotonic()
        wait_for(lambda: running.workers[0].poll() is None and index in
                 {d.index for d in running.devices()}, 60, "the worker to register again")
        print(f"link up: the worker registered again after {time.monotonic() - back:.2f} s")
        listed, = running.devices()
        assert (listed.index, listed.worker) == (index, f"worker-0@{hosts.addresses[2]}")
        with running.connect(device=index) as session:
            assert session.arange(10).sum().numpy() == 45
