"""End-to-end: a worker-token holder cannot take over a live worker's name, and device indexes
never move (issue 30 item 8, issue 24 section 1).

The attacks run against a real broker and workers (``LocalCluster``): a raw DEALER on the
workers' socket registers with the worker token under a live worker's name, and under a name that
sorts before every other; a real ``fabric worker`` process is started under a live name.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import HEARTBEAT
from rawpeers import RawDealer

import fabric
from fabric import LocalCluster
from fabric.core.errors import VersionMismatch, WorkerNameTaken, error_from_wire
from fabric.core.protocol import Kind, Message

pytestmark = pytest.mark.timeout(90)

LIVENESS = 3


@pytest.fixture
def pinned_liveness_cluster():
    """Two workers, as the shared ``cluster``, with the broker's liveness pinned to ``LIVENESS``
    whatever the default: a worker started under a live name retries for that bound."""
    with LocalCluster(workers=2, heartbeat=HEARTBEAT, liveness=LIVENESS) as running:
        yield running


def _register(cluster: LocalCluster, name: str, devices: int = 1, **more: str) -> Message:
    """REGISTER as ``name`` (and ``more`` fields) from a raw DEALER with the worker token;
    the broker's answer."""
    with RawDealer(cluster.worker_address, cluster.worker_token) as peer:
        peer.send_message(Message(Kind.REGISTER, body={
            "token": cluster.worker_token, "name": name, "backend": "numpy",
            "devices": [{"backend": "numpy"}] * devices, **more}))
        return peer.recv_until(lambda m: m.kind in (Kind.REGISTERED, Kind.REJECT), 5.0)


def _listing(cluster: LocalCluster) -> list[tuple[int, str, int]]:
    return [(d.index, d.worker, d.local) for d in
            fabric.devices(cluster.address, token=cluster.token, timeout=5)]


def test_registering_under_a_live_workers_name_is_refused_and_its_session_goes_on(
        pinned_liveness_cluster):
    cluster = pinned_liveness_cluster
    with cluster.connect(device=0, timeout=5) as session:
        x = session.arange(10)
        answer = _register(cluster, "worker-0")
        assert answer.kind == Kind.REJECT
        error = error_from_wire(answer.body)
        assert type(error) is WorkerNameTaken and "--name" in error.message
        # The live worker kept its session, its tensors and its index.
        assert (x * 2).numpy().tolist() == list(range(0, 20, 2))
        assert session.device.index == 0
    assert _listing(cluster) == [(0, "worker-0", 0), (1, "worker-1", 0)]


def test_a_worker_of_another_fabric_release_is_refused_naming_both(pinned_liveness_cluster):
    cluster = pinned_liveness_cluster
    # Issue 24: hosts whose fabric drifted apart fail at once, not in subtle ways later.
    answer = _register(cluster, "elsewhere", fabric_version="0.0.1")
    assert answer.kind == Kind.REJECT
    error = error_from_wire(answer.body)
    assert type(error) is VersionMismatch
    assert f"fabric 0.0.1 and this broker fabric {fabric.__version__}" in error.message
    assert _register(cluster, "same", fabric_version=fabric.__version__).kind == Kind.REGISTERED
    assert "elsewhere" not in [d.worker for d in fabric.devices(cluster.address,
                                                                token=cluster.token)]


def test_a_worker_registering_later_never_shifts_an_index_whatever_its_name(
        pinned_liveness_cluster):
    cluster = pinned_liveness_cluster
    with cluster.connect(device=1, timeout=5) as session:
        # "aaa" sorts before "worker-0": by name order it would take index 0.
        assert _register(cluster, "aaa", devices=2).kind == Kind.REGISTERED
        listed = _listing(cluster)
        assert listed[:2] == [(0, "worker-0", 0), (1, "worker-1", 0)]
        session.sync()
        assert session.device.index == 1 and session.device.worker == "worker-1"
    # The raw peer is gone: its indexes (after the highest) stay reserved, offline.
    with cluster.admin() as admin:
        rows = admin.devices()
    assert [(d["index"], d["worker"]) for d in rows] == [
        (0, "worker-0"), (1, "worker-1"), (2, "aaa"), (3, "aaa")]


def test_a_worker_process_started_under_a_live_name_says_why_and_exits(pinned_liveness_cluster):
    cluster = pinned_liveness_cluster
    env = {**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token}
    # Bounded: it retries for the broker's liveness bound and a heartbeat, then exits.
    result = subprocess.run(
        [sys.executable, "-m", "fabric", "worker", "--broker", cluster.worker_address,
         "--name", "worker-1", "--heartbeat", str(HEARTBEAT), "--liveness", str(LIVENESS)],
        env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stderr
    assert "Worker name 'worker-1' belongs to a live worker" in result.stderr
    assert "another --name" in result.stderr
    assert _listing(cluster) == [(0, "worker-0", 0), (1, "worker-1", 0)]
    with cluster.connect(device=1, timeout=5) as session:
        session.sync()
