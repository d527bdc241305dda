"""A protocol storm against a real broker while a well-behaved client computes.

Three raw peers (``fuzzstorm.StormPeers``: a client, an unregistered worker and a worker
registered as ``zz-fuzz-worker``) send the broker's frontend and workers' socket random and mutated
frames of every kind: first the stored corpus (``tests/corpus/storm.jsonl``, regenerated
with ``.venv/bin/python tests/fuzzstorm.py --write``) replayed in order, then a bounded
number of fresh hypothesis batches, derandomized so every run sends the same storm.
Meanwhile two client threads with their own sockets compute on both real devices and check
every result.

What must hold: the broker process never dies; every message without a readable header is
counted as a protocol error (``fabric.Admin`` status) and every counted one was answered
with ``ProtocolError``; whatever the broker sends back decodes; the clients' results are
all right, none failed, and they kept being served during the storm; afterwards nothing is
left on the broker or the devices.
"""

from __future__ import annotations

import time

import pytest
from faultproxy import ClientLoop, open_fds
from polling import wait_for
from fuzzstorm import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    WORKER_TOKEN,
    StormPeers,
    batches,
    load_corpus,
    storm_messages,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fabric
from conftest import HEARTBEAT

FRESH = settings(max_examples=100, derandomize=True, database=None, deadline=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture
def storm_cluster():
    """Two workers, with the storm's fixed tokens (so stored messages can carry them)."""
    cluster = fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT, broker_args=(
        "--lease", "0.5", "--open-timeout", "1"))
    cluster.token, cluster.worker_token, cluster.admin_token = (
        CLIENT_TOKEN, WORKER_TOKEN, ADMIN_TOKEN)
    with cluster:
        yield cluster


def protocol_errors(cluster: fabric.LocalCluster) -> dict[str, int]:
    with cluster.admin() as admin:
        return admin.status()["protocol_errors"]


def test_the_corpus_is_a_few_hundred_messages_for_every_peer():
    corpus = load_corpus()
    assert len(corpus) >= 1000
    assert {peer for peer, _ in corpus} == {"frontend", "stranger", "worker"}


def test_the_broker_survives_the_storm_answers_it_and_keeps_serving(storm_cluster):
    cluster = storm_cluster
    fds = open_fds()
    corpus = load_corpus()
    before = protocol_errors(cluster)
    with ClientLoop(lambda: cluster.connect(device=0, timeout=5), deadline=11.0, seed=1,
                    pause=0.01) as first, \
            ClientLoop(lambda: cluster.connect(device=1, timeout=5), deadline=11.0, seed=2,
                       pause=0.01) as second, \
            StormPeers(cluster.address, cluster.worker_address) as storm:
        first.wait(3, timeout=10)
        second.wait(3, timeout=10)
        served_before = first.outcomes.right + second.outcomes.right
        started = time.monotonic()
        for batch in batches(corpus):
            storm.send(batch)
            assert cluster.broker.poll() is None, cluster.log_tail("broker", 30)

        @FRESH
        @given(st.lists(storm_messages(), min_size=10, max_size=50))
        def fresh(batch):
            storm.send(batch)
            assert cluster.broker.poll() is None, cluster.log_tail("broker", 30)

        fresh()
        storm.settle()
        took = time.monotonic() - started
        served_during = first.outcomes.right + second.outcomes.right - served_before
    sent = sum(storm.sent.values())
    assert 2500 <= sent and took < 30, (sent, took)
    assert served_during >= 10, served_during  # served while the storm ran
    for loop in (first, second):
        loop.outcomes.check(at_least_right=5)
        assert not loop.outcomes.typed, loop.outcomes.typed
    assert cluster.broker.poll() is None, cluster.log_tail("broker", 30)
    after = protocol_errors(cluster)
    counted = {side: after[side] - before[side] for side in ("frontend", "workers")}
    # Every message without a readable header was counted; every counted one answered.
    assert counted["frontend"] >= storm.malformed["frontend"] > 0
    assert counted["workers"] >= storm.malformed["stranger"] + storm.malformed["worker"] > 0
    assert storm.protocol_errors["frontend"] >= counted["frontend"]
    assert storm.protocol_errors["stranger"] + storm.protocol_errors["worker"] \
        >= counted["workers"]
    # The storm's sessions expire with its peers (lease); nothing is left anywhere.
    with cluster.admin() as admin:
        wait_for(lambda: admin.sessions() == [], 10, "the storm's sessions to expire")
        wait_for(lambda: len(admin.workers()) == 2, 10, "the storm's worker to be dropped")
    for device in (0, 1):
        with cluster.connect(device=device, timeout=5) as checker:
            wait_for(lambda: checker.stats()["device_sessions"] == 1, 10,
                     f"device {device} to hold only the checker's session")
            assert checker.stats()["device_resident_bytes"] == 0
    wait_for(lambda: open_fds() <= fds, 10, "this process's sockets to close")
