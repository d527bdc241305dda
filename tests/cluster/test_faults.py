"""Faults survived: workers, brokers and clients that die or hang, on real processes.

The invariant every test checks: each call returns the right value or raises a typed error
within its deadline; nothing hangs; sessions elsewhere never notice; nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import fabric
from conftest import HEARTBEAT
from polling import wait_for

LOST_WITHIN = 3 * HEARTBEAT + 1.0  # three heartbeat intervals, plus scheduling slack


def online_workers(cluster) -> list[str]:
    return sorted({d.worker for d in cluster.devices()})


@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_dying_worker_fails_its_sessions_fast_and_no_one_else_notices(cluster, how):
    doomed = cluster.connect(device=1, timeout=30)
    bystander = cluster.connect(device=0)
    a = doomed.asarray(np.random.default_rng(0).random((1500, 1500)))
    slow = (a @ a @ a).sum()  # about a second of work: the read below is pending meanwhile
    doomed.flush()
    victim = cluster.workers[1]
    victim.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(fabric.SessionLost) as lost:
            slow.numpy()
        assert time.monotonic() - started < LOST_WITHIN
        assert lost.value.details.get("device") == 1 and "worker-1" in lost.value.message
        with pytest.raises(fabric.SessionLost):  # later calls fail at once
            doomed.ones(2).numpy()
        assert bystander.arange(4).sum().numpy() == 6
        wait_for(lambda: online_workers(cluster) == ["worker-0"], 5, "worker-1 to go")
    finally:
        victim.kill()
        victim.wait()
    doomed.close()
    cluster.start_worker(1)  # a restarted worker registers and serves new sessions
    wait_for(lambda: online_workers(cluster) == ["worker-0", "worker-1"], 10,
             "worker-1 to come back")
    with cluster.connect(device=1) as again:
        assert again.device.worker == "worker-1" and again.arange(3).sum().numpy() == 3
    bystander.close()


def test_a_dead_broker_fails_open_sessions_fast_and_workers_come_back(cluster):
    session = cluster.connect(device=0, timeout=30)
    x = session.ones(10)
    cluster.broker.kill()
    cluster.broker.wait()
    started = time.monotonic()
    with pytest.raises(fabric.SessionLost):
        x.sum().numpy()
    assert time.monotonic() - started < LOST_WITHIN
    session.close()  # closing a lost session is quiet
    cluster.start_broker(cluster.address, cluster.worker_address)
    wait_for(lambda: len(cluster.devices()) == 2, 10, "the workers to register again")
    with cluster.connect(device=1) as fresh:
        assert fresh.ones(3).sum().numpy() == 3


def test_a_vanished_clients_sessions_expire_and_free_their_memory():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             broker_args=("--lease", "0.5")) as cluster:
        script = (
            "import fabric, os, sys\n"
            "s = fabric.connect(sys.argv[1], token=os.environ['FABRIC_TOKEN'])\n"
            "keep = s.ones(1_000_000)\n"
            "s.sync()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
        )
        client = subprocess.Popen([sys.executable, "-c", script, cluster.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "FABRIC_TOKEN": cluster.token})
        try:
            assert client.stdout.readline().strip() == "ready"
            with cluster.connect() as watcher:
                assert watcher.stats()["device_resident_bytes"] == 8_000_000
                client.kill()
                client.wait()
                wait_for(lambda: watcher.stats()["device_sessions"] == 1, 10,
                         "the vanished client's session to expire")
                assert watcher.stats()["device_resident_bytes"] == 0
        finally:
            if client.poll() is None:
                client.kill()
            client.communicate(timeout=5)


def test_a_device_busy_when_its_broker_restarts_serves_the_new_one():
    """The broker dies while a device runs a long op with more of its session's ops unread in
    the lane (``--hwm 2`` bounds the read-ahead): the device thread then sees the control
    thread's RESET and its old lane in one poll, and must serve the new broker."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--hwm", "2")) as cluster:
        session = cluster.connect(timeout=30)
        square = session.asarray(np.ones((3000, 3000)))
        session.sync()
        products = [square @ square for _ in range(6)]  # about half a second each
        session.flush()
        time.sleep(0.3)  # the first product runs; the others wait, three unread in the lane
        cluster.broker.kill()
        cluster.broker.wait()
        cluster.start_broker(cluster.address, cluster.worker_address)
        cluster.wait_for_devices(1, timeout=20)
        with cluster.connect(timeout=10) as fresh:
            assert fresh.arange(3).sum().numpy() == 3
        assert "Traceback" not in cluster.log_tail("worker-0", 200)
        del products
        session.close()
