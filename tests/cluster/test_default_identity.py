"""A worker started without --name is HOST/SLOT, the lowest slot free on its host for its
broker (issue 24 section 1): workers started at once get distinct slots, and workers killed
and restarted take back their names and device indexes, adding no offline ones.

End to end with a real broker and real ``fabric worker`` processes; the slot claims
themselves (``fabric.core.host_slot``) are also checked in this process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import HEARTBEAT
from polling import wait_for

from fabric import LocalCluster
from fabric.core.host_slot import claim_slot

pytestmark = pytest.mark.timeout(90)

HOST = socket.gethostname()


@pytest.fixture
def broker():
    """A broker with no workers of its own."""
    with LocalCluster(workers=0, heartbeat=HEARTBEAT) as running:
        yield running


def _start_unnamed_workers(cluster: LocalCluster, count: int) -> list[subprocess.Popen]:
    env = {**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token}
    return [subprocess.Popen(
        [sys.executable, "-m", "fabric", "worker", "--broker", cluster.worker_address,
         "--heartbeat", str(HEARTBEAT)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(count)]


def _registered(cluster: LocalCluster, workers: list[subprocess.Popen]) -> list[dict]:
    """The broker's device rows (online or not) once every one of ``workers`` registered:
    as many workers registered since this call as were started."""
    started, rows = time.monotonic(), []

    def all_registered() -> list[dict]:
        with cluster.admin() as admin:
            # (workers first: a device row read before a worker the second call counts would
            # show that worker's device offline)
            registered = admin.workers()
            rows[:] = admin.devices()
        if sum(row["registered_ago"] < time.monotonic() - started
               for row in registered) == len(workers):
            return rows  # (a device each, at least: never empty)
        for worker in workers:
            assert worker.poll() is None, worker.stderr.read().decode()
        return []
    return wait_for(all_registered, 30, f"{len(workers)} workers to register", interval=0.1,
                    detail=lambda: rows)


def _end(workers: list[subprocess.Popen], how: signal.Signals) -> None:
    for worker in workers:
        worker.send_signal(how)
    for worker in workers:
        worker.wait(timeout=10)
        worker.stderr.close()


def test_unnamed_workers_started_at_once_get_distinct_slots_and_take_them_back(broker):
    first = _start_unnamed_workers(broker, 2)
    try:
        rows = _registered(broker, first)
    finally:
        _end(first, signal.SIGKILL)  # no goodbye: as a crash or the OOM killer ends them
    slots = sorted((row["worker"], row["index"]) for row in rows)
    assert [name for name, _ in slots] == [f"{HOST}/0", f"{HOST}/1"]
    assert sorted(index for _, index in slots) == [0, 1]

    again = _start_unnamed_workers(broker, 2)  # at once, as a supervisor restarts them
    try:
        rows = _registered(broker, again)
        with broker.connect(device=1, timeout=5) as session:
            assert (session.arange(4) * 3).numpy().tolist() == [0, 3, 6, 9]
    finally:
        _end(again, signal.SIGTERM)
    # The same names on the same indexes, and no index left offline for a dead process.
    assert sorted((row["worker"], row["index"]) for row in rows) == slots
    assert all(row["online"] for row in rows)


def test_a_slot_is_the_lowest_no_live_claim_holds_for_that_broker():
    held = [claim_slot("tcp://127.0.0.1:1"), claim_slot("tcp://127.0.0.1:1")]
    other = claim_slot("tcp://127.0.0.1:2")
    try:
        assert [slot.name for slot in held] == [f"{HOST}/0", f"{HOST}/1"]
        assert other.slot == 0  # another broker's slots are its own
        held[0].close()
        held[0] = claim_slot("tcp://127.0.0.1:1")
        assert held[0].slot == 0  # freed, so taken back before a new one
        held.append(claim_slot("tcp://127.0.0.1:1", host="node7"))
        assert held[-1].name == "node7/2"
    finally:
        for slot in (*held, other):
            slot.close()
