"""Large arrays in flight when the active broker of a pair is SIGKILLed, with real processes:
uploads and reads through shared memory, and over direct links (a client's to its worker, and
``t.to()`` worker to worker). The session goes on with the right values through the broker
that takes over; nothing hangs, and no segment is left mapped.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

import fabric
from conftest import broker_pair
from fabric.core.shm import held_segments
from polling import wait_for
from test_failover_resume import admin_state, kill_primary
from test_shm_path import mapped

pytestmark = pytest.mark.timeout(120)

ELEMENTS = 2 << 20  # 16 MiB of float64: shared memory's and a direct link's size


@pytest.fixture
def pair(tmp_path):
    """Two workers with direct links on loopback (as between hosts: ``--bulk-host``)."""
    with broker_pair(tmp_path, "--settle", "3", workers=2,
                     worker_args=("--bulk-host", "127.0.0.1")) as cluster:
        yield cluster


def links_granted(address: str, cluster: fabric.LocalCluster) -> int:
    with fabric.Admin(address, token=cluster.admin_token, timeout=3) as admin:
        return admin.status()["counters"].get("links_granted", 0)


def across_a_kill(cluster: fabric.LocalCluster, move) -> int:
    """``move(round)`` (which checks its own values) again and again while another thread
    SIGKILLs the primary, so that the kill falls on one in flight, and three rounds after
    the kill; the rounds run. The backup must serve by then."""
    killer = threading.Timer(0.1, kill_primary, (cluster,))
    killer.start()
    rounds = after = 0
    try:
        while after < 3:
            after += not killer.is_alive()
            move(rounds)
            rounds += 1
    finally:
        killer.join()
    assert admin_state(cluster, cluster.standby_address) == "active"
    return rounds


def no_segment_of_ours_left(cluster: fabric.LocalCluster) -> None:
    gc.collect()  # (read-only views hold their slots until collected)
    me = os.getpid()
    for worker in cluster.workers:
        wait_for(lambda: not mapped(worker.pid, me), 10, f"{worker.pid} to unmap our segments")
    assert held_segments(me) == {}


def test_uploads_and_reads_through_shared_memory_go_on_across_a_kill(pair):
    values = np.random.default_rng(44).random(ELEMENTS)
    with fabric.connect(pair.brokers, token=pair.token, timeout=30) as session:
        def upload_and_read(round_: int) -> None:
            got = (session.asarray(values + round_) * 2).numpy()
            assert np.array_equal(got, (values + round_) * 2), round_

        across_a_kill(pair, upload_and_read)
        assert session.stats()["bytes_uploaded_by_socket"] == 0  # all through shared memory
    no_segment_of_ours_left(pair)


def test_uploads_and_reads_over_a_direct_link_go_on_across_a_kill(pair):
    values = np.random.default_rng(45).random(ELEMENTS)
    with fabric.connect(pair.brokers, token=pair.token, timeout=30,
                        shared_memory=False) as session:
        def upload_and_read(round_: int) -> None:
            got = (session.asarray(values + round_) * 2).numpy()
            assert np.array_equal(got, (values + round_) * 2), round_

        upload_and_read(-1)  # (before the kill: the session's uploads take links)
        assert session.stats()["bytes_uploaded_by_direct_link"] > 0
        across_a_kill(pair, upload_and_read)
        # Its uploads take links again (a LINK the dead broker left unanswered is no "no")
        before = session.stats()["bytes_uploaded_by_direct_link"]
        upload_and_read(-2)
        assert session.stats()["bytes_uploaded_by_direct_link"] == before + values.nbytes


def test_a_move_worker_to_worker_over_a_direct_link_goes_on_across_a_kill(pair):
    """A tensor moved with ``t.to()`` while the primary dies: a move whose link the worker's
    new connection closed goes through the broker that took over, to its device."""
    values = np.random.default_rng(46).random(ELEMENTS)
    with fabric.connect(pair.brokers, token=pair.token, device=0, timeout=30,
                        shared_memory=False) as here:
        there = here.open(1)
        source = here.asarray(values)

        def move(round_: int) -> None:
            got = float(((source + round_).to(there) * 2).sum())
            assert got == pytest.approx(float(((values + round_) * 2).sum())), round_

        move(-1)  # (before the kill: a link carries it)
        across_a_kill(pair, move)
        there.close()
