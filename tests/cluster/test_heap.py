"""A worker's heap keeps what its arrays free while its devices work, and gives it back once
they idle (``workers.heap``), against a real worker."""

from __future__ import annotations

import time

import pytest

import fabric

from conftest import HEARTBEAT
from test_peer_fields import resident

pytestmark = pytest.mark.timeout(60)

ARRAY = 256 << 20  # bytes: below the 1 GiB free that glibc's own trim waits for


def test_an_idle_worker_gives_back_what_its_arrays_freed():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            cluster.connect(timeout=30) as session:
        worker = cluster.workers[0].pid
        array = session.ones(ARRAY // 8)
        assert array.sum().numpy() == ARRAY // 8
        held = resident(worker)
        del array
        session.sync()
        deadline = time.monotonic() + 20 * HEARTBEAT + 5
        while resident(worker) > held - ARRAY // 2 and time.monotonic() < deadline:
            time.sleep(HEARTBEAT / 2)
        assert resident(worker) <= held - ARRAY // 2, (held, resident(worker))
