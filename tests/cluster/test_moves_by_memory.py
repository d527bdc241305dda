"""A tensor moved between two workers of this host (``t.to()``) read by the receiving worker
straight out of the sending one's memory (``workers.lent_memory``), where no slot of shared
memory is ready: real brokers and workers on loopback."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import fabric
from fabric.core.errors import RequestTimeout
from fabric.launch.local import BULK_MALLOC_STARTED
from fabric.transport import bulk

from polling import wait_for
from test_cross_memory import connect, through_memory
from test_shm_ahead import _state
from test_shm_path import DTYPES, random_array
from test_shm_path import shm_cluster  # noqa: F401 (a fixture)

MiB = 1 << 20


def lent_bytes(session: fabric.Session) -> int:
    """Bytes ``session``'s device keeps lent by memory, once it ran what was sent."""
    session.sync()
    return session.stats()["device_lent_bytes"]


@pytest.mark.timeout(120)
def test_every_dtype_moves_by_memory_and_each_lend_is_let_go(shm_cluster):
    with connect(shm_cluster, device=0) as session, connect(shm_cluster, device=1) as other:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        assert other.arange(4).sum().numpy() == 6 and through_memory(other)
        for dtype in DTYPES:
            array = random_array(dtype, (1024, 1100))  # (1 MiB at least)
            moved = session.asarray(array).to(other)
            assert moved.session is other
            np.testing.assert_array_equal(moved.numpy(), array)
            assert lent_bytes(session) == 0  # (released once the receiver answered)
        moved = session.asarray(np.arange(MiB, dtype=np.float64))[::2].to(other)  # a view
        np.testing.assert_array_equal(moved.numpy(), np.arange(0, MiB, 2, dtype=np.float64))
        assert lent_bytes(session) == 0


@pytest.mark.timeout(120)
def test_a_move_whose_receiver_never_answered_keeps_its_lend_and_both_go_on(monkeypatch):
    # A lend is let go only once the receiver said it read it: given up on, it stays (until
    # its time runs out), so that the receiver, once it runs again, reads what was lent.
    with fabric.LocalCluster(workers=2, heartbeat=2.0) as cluster, \
            connect(cluster, device=0, timeout=10) as session, \
            connect(cluster, device=1, timeout=1) as other:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        assert other.arange(4).sum().numpy() == 6 and through_memory(other)
        tensor = session.asarray(np.arange(MiB, dtype=np.float64))
        receiver = cluster.workers[1]
        decide = bulk.slot_for_move

        def stopping_the_receiver(*args):  # (once it agreed to take the tensor)
            receiver.send_signal(signal.SIGSTOP)
            wait_for(lambda: _state(receiver.pid) == "T", 5, "the worker to stop")
            return decide(*args)

        monkeypatch.setattr(bulk, "slot_for_move", stopping_the_receiver)
        try:
            with pytest.raises(RequestTimeout):
                tensor.to(other)
            assert lent_bytes(session) == tensor.nbytes  # (the sender is another worker)
        finally:
            receiver.send_signal(signal.SIGCONT)
        monkeypatch.undo()
        other.timeout = 10
        moved = tensor.to(other)
        np.testing.assert_array_equal(moved.numpy(), np.arange(MiB, dtype=np.float64))
        assert lent_bytes(session) == tensor.nbytes  # (the first lend waits for its time)
        assert all(worker.poll() is None for worker in cluster.workers)


@pytest.mark.timeout(120)
def test_without_cross_memory_a_move_takes_a_slot(shm_cluster):
    with connect(shm_cluster, device=0, shared_memory=fabric.SharedMemory(
            cross_memory=False)) as session, \
            connect(shm_cluster, device=1, shared_memory=fabric.SharedMemory(
                cross_memory=False)) as other:
        assert session.arange(4).sum().numpy() == 6 and not through_memory(session)
        tensor = session.asarray(np.arange(MiB, dtype=np.float64))
        moved = tensor.to(other)
        np.testing.assert_array_equal(moved.numpy(), np.arange(MiB, dtype=np.float64))
        assert lent_bytes(session) == 0 and other.in_device_slots


# A process run as another user (nobody), where this test runs as root and may start one
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
# The client's part, as nobody: a move from a session on the sending worker (device 1) to one
# on the receiving worker (device 0), and what came of it
MOVE_AS_NOBODY = """
import json, sys
import numpy as np
import fabric
address, token = sys.argv[1:]
with fabric.connect(address, token=token, device=1, timeout=30,
                   shared_memory=fabric.SharedMemory(start_slot=0)) as sender, \\
        sender.open(0, timeout=30) as receiver:
    array = np.arange(1 << 20, dtype=np.float64)
    moved = sender.asarray(array).to(receiver)
    print(json.dumps({"same": bool(np.array_equal(moved.numpy(), array)),
                      "by memory": [s.probe.reads_memory for s in (sender, receiver)],
                      "sent again": receiver.stats()["moves_sent_again"],
                      "lent": sender.stats()["device_lent_bytes"]}))
"""


def _nobody() -> bool:
    try:
        return os.geteuid() == 0 and shutil.which("setpriv") is not None \
            and pwd.getpwnam("nobody") is not None
    except KeyError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.skipif(not _nobody(), reason="starts processes as nobody: root and setpriv")
def test_a_lend_the_receiving_worker_may_not_read_is_sent_again_with_its_bytes(tmp_path):
    """The client and the sending worker run as another user (nobody), the receiving worker
    as root: it reads the client's memory, so the move goes by memory, but it refuses a lend
    of another user's process. The move is asked for ``again`` and comes with its bytes: it
    lands, counted, and the sender's lend is let go."""
    with fabric.LocalCluster(workers=1) as cluster, open(tmp_path / "nobody.log", "wb") as log:
        sender = subprocess.Popen(
            [*AS_NOBODY, sys.executable, "-m", "fabric", "worker", "--broker",
             cluster.worker_address, "--name", "worker-nobody"],
            env={**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token,
                 BULK_MALLOC_STARTED: "1"},  # (it starts as it is: nobody may not exec it)
            stdout=log, stderr=subprocess.STDOUT)
        try:
            cluster.wait_for_devices(2)
            done = subprocess.run([*AS_NOBODY, sys.executable, "-c", MOVE_AS_NOBODY,
                                   cluster.address, cluster.token],
                                  capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout.splitlines()[-1]) == {
                "same": True, "by memory": [True, True], "sent again": 1, "lent": 0}
        finally:
            sender.terminate()
            try:
                sender.wait(10)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.wait(10)
