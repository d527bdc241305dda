"""The broker's /metrics endpoint under connections that never finish a request, against a
real broker (issue 41, section 2, finding 14): its threads stay bounded, idle connections
are closed after the read timeout, and scrapes are served again."""

from __future__ import annotations

import socket
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from fabric import LocalCluster
from fabric.broker.metrics import MAX_CONNECTIONS, READ_SECONDS

from conftest import HEARTBEAT
from polling import wait_for

pytestmark = pytest.mark.timeout(120)

IDLE = 250  # the count of idle connections


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def test_idle_connections_to_metrics_hold_no_thread_each_and_are_closed(tmp_path):
    # Finding 14: 250 idle connections to the metrics port held a broker thread each, with
    # no timeout, for as long as the peer liked.
    with LocalCluster(workers=1, heartbeat=HEARTBEAT, broker_args=("--metrics", "0")) as cluster:
        pid, parts = cluster.broker.pid, urlsplit(cluster.metrics_url)
        urllib.request.urlopen(cluster.metrics_url, timeout=5).read()  # (its first scrape)
        before = threads_of(pid)
        idle = []
        try:
            for _ in range(IDLE):
                idle.append(socket.create_connection((parts.hostname, parts.port), timeout=5))
                idle[-1].sendall(b"GET /metr")  # a request begun, never finished
            time.sleep(1.0)  # (an unbounded server starts a thread for each meanwhile)
            assert threads_of(pid) <= before + MAX_CONNECTIONS, threads_of(pid) - before
            # Each is closed by the broker once its read time is up (or at once, past the
            # bound): the peer reads the end of its connection.
            deadline = time.monotonic() + READ_SECONDS + 10
            for conn in idle:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    assert conn.recv(4096) == b""
                except ConnectionResetError:
                    pass  # (closed with our bytes unread: a reset says the same)
            wait_for(lambda: threads_of(pid) <= before, 5, "the metrics threads to end")
        finally:
            for conn in idle:
                conn.close()
        with urllib.request.urlopen(cluster.metrics_url, timeout=5) as answer:
            assert b"fabric_" in answer.read()  # scrapes are served again
        with cluster.connect() as session:  # and the broker's clients all along
            assert session.arange(5).sum().numpy() == 10
