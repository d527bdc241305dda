"""End to end: clients, ``fabric admin`` and workers given a wrong address are told what is
wrong, at once, and exit with the documented code.

A client or admin at the broker's workers' port is told so and given the client port (admin
exits 3); a worker at the client port exits 2 saying so; a worker with nothing at its address
names it while it retries, and stops after ``--give-up-after``; a host name that does not
resolve is said to be one. Real broker and worker processes on loopback; names under
``.invalid`` never resolve (RFC 6761).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fabric
from fabric.core.errors import ConnectError, WrongPort

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOWHERE = "tcp://127.0.0.1:1"  # nothing listens on port 1
UNRESOLVABLE = "tcp://no-such-host.invalid:25555"


def fabric_cli(*args: str, env: dict[str, str] | None = None,
               timeout: float = 30.0) -> subprocess.CompletedProcess:
    """``python -m fabric ARGS`` to completion (killed and reaped at ``timeout``)."""
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_client_at_the_workers_port_is_told_so_and_given_the_client_port(shared_cluster):
    for call in (lambda: fabric.connect(shared_cluster.worker_address,
                                        token=shared_cluster.token, timeout=5),
                 lambda: fabric.devices(shared_cluster.worker_address,
                                        token=shared_cluster.token, timeout=5)):
        with pytest.raises(WrongPort) as info:
            call()
        assert isinstance(info.value, ConnectError)
        assert "This is the broker's port for workers" in info.value.message
        assert f"bound at {shared_cluster.address}" in info.value.message
    with shared_cluster.connect() as session:  # the broker goes on serving
        assert session.arange(3).sum().numpy() == 3


def test_a_broker_bound_to_every_interface_names_its_advertised_address():
    with fabric.LocalCluster(workers=0, heartbeat=0.2, frontend="tcp://0.0.0.0:*",
                             broker_args=("--advertise", "127.0.0.1")) as cluster:
        port = cluster.address.rpartition(":")[2]
        with pytest.raises(WrongPort) as info:
            fabric.devices(cluster.worker_address, token=cluster.token, timeout=5)
        assert f"bound at tcp://127.0.0.1:{port}" in info.value.message


def test_fabric_admin_at_the_workers_port_exits_3_naming_the_client_port(shared_cluster):
    done = fabric_cli("admin", "--address", shared_cluster.worker_address, "status",
                      env={"FABRIC_ADMIN_TOKEN": shared_cluster.admin_token})
    assert done.returncode == 3, done.stderr
    assert "port for workers" in done.stderr
    assert f"bound at {shared_cluster.address}" in done.stderr
    assert "not registered" not in done.stderr


def test_a_worker_at_the_client_port_exits_2_at_once_saying_so(shared_cluster):
    done = fabric_cli("worker", "--broker", shared_cluster.address, "--name", "lost",
                      env={"FABRIC_WORKER_TOKEN": shared_cluster.worker_token})
    assert done.returncode == 2, done.stderr
    stderr = one_line(done.stderr)
    assert "This worker reached the broker's client port" in stderr
    assert f"bound at {shared_cluster.worker_address}" in stderr  # where to go instead
    assert "not accepted from a client" not in stderr
    assert "lost" not in {d.worker for d in shared_cluster.devices()}


def test_a_worker_with_nothing_at_its_address_names_it_and_gives_up_when_told():
    done = fabric_cli("worker", "--broker", NOWHERE, "--heartbeat", "0.2",
                      "--give-up-after", "2", env={"FABRIC_WORKER_TOKEN": "w"})
    assert done.returncode == 1, done.stderr
    assert f"the broker at {NOWHERE} has been silent for" in done.stderr  # while it retried
    assert (f"fabric worker: The broker at {NOWHERE} has said nothing for"
            in one_line(done.stderr))
    assert "(--give-up-after 2): stopping." in one_line(done.stderr)


def test_a_worker_gives_up_on_a_broker_that_goes_away_too():
    with fabric.LocalCluster(workers=0, heartbeat=0.2) as cluster:
        worker = subprocess.Popen(
            [sys.executable, "-m", "fabric", "worker", "--broker", cluster.worker_address,
             "--heartbeat", "0.2", "--give-up-after", "2"], cwd=REPO,
            env={**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert len(cluster.wait_for_devices(1)) == 1  # registered: the broker answers
        except BaseException:
            worker.kill()
            worker.communicate(timeout=10)
            raise
    try:
        _, err = worker.communicate(timeout=30)  # the broker stopped with the cluster
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=10)
    assert worker.returncode == 1, err
    assert "has said nothing for" in err and "--give-up-after 2" in err


def test_a_host_name_that_does_not_resolve_is_said_to_be_one_by_client_and_admin():
    for call in (lambda: fabric.connect(UNRESOLVABLE, token="t", timeout=5),
                 lambda: fabric.devices(UNRESOLVABLE, token="t", timeout=5)):
        with pytest.raises(ConnectError) as info:
            call()
        assert ("The host name 'no-such-host.invalid' in tcp://no-such-host.invalid:25555 "
                "does not resolve") in info.value.message
        assert "Nothing is listening" not in info.value.message
    done = fabric_cli("admin", "--address", UNRESOLVABLE, "status",
                      env={"FABRIC_ADMIN_TOKEN": "t"})
    assert done.returncode == 3, done.stderr
    assert "'no-such-host.invalid'" in done.stderr and "does not resolve" in done.stderr


def test_a_worker_says_its_brokers_host_name_does_not_resolve():
    done = fabric_cli("worker", "--broker", UNRESOLVABLE, "--heartbeat", "0.2",
                      "--give-up-after", "1", env={"FABRIC_WORKER_TOKEN": "w"})
    assert done.returncode == 1, done.stderr
    assert "The host name 'no-such-host.invalid'" in done.stderr
    assert "does not resolve" in done.stderr.splitlines()[-1]  # in its last words too


def test_nothing_listening_at_a_resolvable_address_is_still_said_so():
    with pytest.raises(ConnectError, match="Nothing is listening at tcp://127.0.0.1:1"):
        fabric.connect(NOWHERE, token="t", timeout=5)
