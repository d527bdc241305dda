"""Busy is not dead, on real processes (issue 41): a worker whose device holds the GIL on a
machine whose every core is loaded keeps its sessions; one stopped, killed or cut off by a
network partition loses them with typed errors within the liveness bound; a graph of
hundreds of thousands of ops in one SUBMIT is refused without holding up anyone's link.

Every process a test starts (busy loads, a worker in a network namespace) is ended by the
test, whatever happens; the namespace and its link are deleted. Sans-I/O: ``test_liveness_rule``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Iterator

import numpy as np
import pytest

import fabric
from conftest import HEARTBEAT
from polling import wait_for
from test_shm_ahead import _state
from fabric.core.wire import MAX_GRAPH_OPS

pytestmark = pytest.mark.timeout(240)

LIVENESS = 3 * HEARTBEAT  # the bound: a link silent this long is closed by libzmq
LOST_WITHIN = LIVENESS + HEARTBEAT + 1.0  # and the broker asks it (one beat), plus slack
# A busy process: spins until its deadline (or until the test kills it first).
_SPIN = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
         "while time.monotonic() < end: pass\n")


@contextlib.contextmanager
def every_core_loaded(seconds: float) -> Iterator[int]:
    """Two busy processes per core (a load of twice the cores) for the ``with`` block, at most
    ``seconds``; ended with it, whatever happens. Yields how many."""
    count = 2 * (os.cpu_count() or 1)
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)])
                for _ in range(count)]
    try:
        yield count
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(10)


def chain(x):
    """W6's workload: 20 elementwise ops, then a full sum (as in bench/w6_sharded.py)."""
    for step in range(5):
        x = (x * 1.0001 + step) / 1.5
        x = abs(x) - 0.25
    return x.sum()


def gil_holder(steps: int, offset: float):
    """A traced function of ``steps`` ops: registering it, the device compiles them in one call
    of Python's ``compile``, which holds the GIL throughout (a second or more on a loaded
    core at the graph bound)."""
    def body(x):
        for _ in range(steps):
            x = x + offset
        return x
    body.__name__ = f"gil_holder_{offset:g}"
    return fabric.function(body)


def workers_lost(cluster: fabric.LocalCluster) -> int:
    with cluster.admin() as admin:
        return admin.status()["counters"].get("workers_lost", 0)


def test_w6_on_a_loaded_machine_while_a_device_holds_the_gil_loses_no_session():
    rows = (96 << 20) // (8 * 512)  # 96 MiB of float64, 48 MiB a device
    data = np.random.default_rng(41).random((rows, 512))
    expected = chain(data)
    with fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT) as cluster, \
            cluster.connect(timeout=120) as session, \
            cluster.connect(device=0, timeout=120) as other:
        mesh = session.mesh(devices=[0, 1])
        holders = [gil_holder(MAX_GRAPH_OPS - 1, offset) for offset in (1.0, 2.0, 3.0)]
        small = other.asarray(np.zeros(4))
        with every_core_loaded(180):
            x = mesh.asarray(data)  # through shared memory: fresh segments on both devices
            for holder in holders:
                holder(small)  # registered (compiled) on device 0 while the chain is queued
                result = chain(x).numpy()
                assert np.isclose(result, expected, rtol=1e-9), (result, expected)
            other.sync()
            assert np.allclose(holders[-1](small).numpy(), 3.0 * (MAX_GRAPH_OPS - 1))
        assert workers_lost(cluster) == 0, cluster.log_tail("broker", 20)


def test_a_stopped_worker_on_a_loaded_machine_is_lost_within_the_bound_and_comes_back():
    with fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT) as cluster, \
            cluster.connect(device=1, timeout=30) as doomed, \
            cluster.connect(device=0, timeout=30) as bystander:
        assert doomed.ones(3).sum().numpy() == 3
        victim = cluster.workers[1]
        with every_core_loaded(60):
            victim.send_signal(signal.SIGSTOP)
            try:  # (the stop takes effect a little later on a loaded machine: a read that
                # the worker answered first was seen in a full run)
                wait_for(lambda: _state(victim.pid) == "T", 10, "the worker to stop")
                started = time.monotonic()
                with pytest.raises(fabric.SessionLost) as lost:
                    doomed.arange(4).sum().numpy()
                took = time.monotonic() - started
                assert "worker-1" in lost.value.message
                assert bystander.arange(4).sum().numpy() == 6
            finally:
                victim.send_signal(signal.SIGCONT)
        assert took < LOST_WITHIN, took
        # Woken, it finds its link closed and registers again under new identities.
        cluster.wait_for_devices(2, timeout=20)
        with cluster.connect(device=1, timeout=10) as again:
            assert again.arange(3).sum().numpy() == 3


def test_a_graph_of_300000_ops_in_one_submit_is_refused_and_bystanders_keep_their_sessions():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            cluster.connect(timeout=60) as insider, \
            cluster.connect(timeout=60) as bystander:
        kept = bystander.asarray(np.arange(5.0))
        x = insider.asarray(np.zeros(4))
        ops = [["add", i + 2, [i + 1, 1.0], {}] for i in range(300_000)]  # one graph: 7 MB
        insider.stream.enqueue(["graph_register", 0, [], {
            "graph": 1, "name": "huge", "ops": ops, "inputs": [[[4], "<f8"]],
            "outputs": [300_001]}])  # past the client's trace-time bound: a raw registration
        insider.flush()
        started = time.monotonic()
        with pytest.raises(fabric.GraphError) as refused:
            insider.sync()
        assert time.monotonic() - started < 30
        assert f"more than the {MAX_GRAPH_OPS} a graph may hold" in refused.value.message
        assert "trace a smaller function" in refused.value.message
        assert (x + 1).sum().numpy() == 4  # the insider's own session goes on too
        assert kept.sum().numpy() == 10.0
        assert workers_lost(cluster) == 0


# -- a network partition, in a network namespace ----------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def network_namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this one by a veth pair on a /30 of its own, in the
    range set aside for network tests (198.18.0.0/15, RFC 2544), chosen from this process's
    id so that tests run side by side do not share one; yields (namespace, the host end's
    interface, the host end's address). Deleted afterwards, its link with it."""
    pid = os.getpid()
    base = ipaddress.IPv4Address("198.18.0.0") + ((pid << 2) % (1 << 17))
    namespace, host, inside = f"fabric-part-{pid}", f"fph{pid}", f"fpn{pid}"
    try:
        _ip("netns", "add", namespace)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make a network namespace here: {exc}")
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", inside, "netns", namespace)
        _ip("addr", "add", f"{base + 1}/30", "dev", host)
        _ip("link", "set", host, "up")
        _ip("-n", namespace, "addr", "add", f"{base + 2}/30", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield namespace, host, str(base + 1)
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=10)


needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="a network partition needs root and iproute2's ip (network namespaces)")


@needs_namespaces
def test_a_partitioned_worker_is_lost_within_the_bound_and_comes_back_when_healed():
    with network_namespace() as (namespace, host, address), \
            fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                                worker_address=f"tcp://{address}:*") as cluster:
        # worker-1 runs inside the namespace: its only way to the broker is the veth pair.
        worker = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "fabric", "worker",
             "--broker", cluster.worker_address, "--threads", "1",
             *cluster.worker_options(1)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token})
        try:
            cluster.wait_for_devices(2, timeout=30)
            with cluster.connect(device=1, timeout=30) as cut, \
                    cluster.connect(device=0, timeout=30) as bystander:
                assert cut.ones(3).sum().numpy() == 3
                _ip("link", "set", host, "down")  # the cable pulled: nothing crosses, no reset
                started = time.monotonic()
                with pytest.raises(fabric.SessionLost) as lost:
                    cut.arange(4).sum().numpy()
                took = time.monotonic() - started
                assert "worker-1" in lost.value.message
                assert took < LOST_WITHIN, took
                assert bystander.arange(4).sum().numpy() == 6
                time.sleep(LIVENESS)  # the worker's own end gives up on the link too
                _ip("link", "set", host, "up")
            wait_for(lambda: len(cluster.devices()) == 2, 30, "worker-1 to register again")
            assert worker.poll() is None, "the partitioned worker ended"
            with cluster.connect(device=1, timeout=10) as again:
                assert again.arange(3).sum().numpy() == 3
        finally:
            worker.kill()
            worker.wait(10)
