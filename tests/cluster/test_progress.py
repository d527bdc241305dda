"""Progress of long waits (``fabric.arrays.progress``) on a real cluster: a callable is told only
bytes that arrived, chunk by chunk; ``progress=True`` draws a bar in a real terminal (a
pseudo-terminal) and changes nothing where there is none; by default a sync that waits over a
second shows the time waited there, and ``FABRIC_PROGRESS=0`` turns that off."""

from __future__ import annotations

import fcntl
import math
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest

from fabric.arrays.progress import CHUNK_BYTES, MIN_BYTES


def test_an_upload_counts_each_chunk_once_the_device_stored_it(session):
    array = np.random.default_rng(1).random((2500, 2000))  # 40 MB: three chunks
    ops_before = session.stats()["ops"]
    seen = []

    def told(done: int, total: int) -> None:
        # Each chunk is a put and a write into the tensor made first: both ran on the
        # device before its bytes count (a stats request is answered after them).
        seen.append((done, total, session.stats()["ops"] - ops_before))

    tensor = session.asarray(array, progress=told)
    chunks = math.ceil(array.nbytes / CHUNK_BYTES)
    assert [done for done, _, _ in seen] == \
        [0, *(min(k * CHUNK_BYTES, array.nbytes) for k in range(1, chunks + 1))]
    assert {total for _, total, _ in seen} == {array.nbytes}
    assert [ran for _, _, ran in seen] == [1 + 2 * k for k in range(chunks + 1)]
    assert tensor.shape == array.shape and tensor.dtype == array.dtype
    assert np.array_equal(tensor.numpy(), array)


def test_a_read_counts_each_chunk_once_its_bytes_are_in(session):
    array = np.arange(5_000_000, dtype=np.int64).reshape(100, 50_000)[:, ::2]  # 20 MB
    tensor = session.asarray(array)
    seen = []
    values = tensor.numpy(progress=lambda done, total: seen.append((done, total)))
    assert np.array_equal(values, array) and values.flags.writeable
    assert seen == [(0, array.nbytes), (CHUNK_BYTES, array.nbytes),
                    (array.nbytes, array.nbytes)]


def test_progress_true_without_a_terminal_changes_nothing(session, capfd):
    array = np.ones(MIN_BYTES // 8)  # large enough for a bar, but no terminal here
    ops_before = session.stats()["ops"]
    tensor = session.asarray(array, progress=True)
    assert session.stats()["ops"] - ops_before == 1  # one upload, in one message
    assert tensor.numpy(progress=True).sum() == array.size
    assert capfd.readouterr() == ("", "")


_SCRIPT = """
import sys, numpy as np, fabric
with fabric.connect(sys.argv[1], token=sys.argv[2]) as s:
    t = s.asarray(np.ones((2 * fabric.arrays.progress.MIN_BYTES) // 8), progress=True)
    print("read", t.numpy(progress=True).sum())
"""

# Work that keeps a sync waiting: one matmul, larger each time (its work doubles each
# step), until one sync has waited long enough for its bar (or the bounded sizes ran out: then
# the test fails on the print). One op, so the client never waits for credit before the sync.
_LONG_SYNC = """
import sys, time, numpy as np, fabric
with fabric.connect(sys.argv[1], token=sys.argv[2], timeout=120) as s:
    for step in range(12):
        n = int(512 * 2 ** (step / 3))
        x = s.random.normal(size=(n, n))
        s.sync()
        y = x @ x
        start = time.monotonic()
        s.sync()
        if time.monotonic() - start > 2 * fabric.arrays.progress.WAIT_BEFORE_BAR:
            print("long sync")
            break
"""


def _in_a_terminal(script: str, cluster, **env_changes: str) -> str:
    """What ``script`` (run with the cluster's address and token) wrote to a pseudo-terminal:
    its stdout and stderr, as a person would see them."""
    leader, follower = pty.openpty()
    # (a terminal's size: a bar fits its width, and a new pseudo-terminal's is 0 by 0)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", **env_changes}
    with subprocess.Popen([sys.executable, "-c", script, cluster.address, cluster.token],
                          stdin=follower, stdout=follower, stderr=follower, env=env) as child:
        os.close(follower)
        output = b""
        try:
            while child.poll() is None or select.select([leader], [], [], 0)[0]:
                if select.select([leader], [], [], 0.1)[0]:
                    try:
                        output += os.read(leader, 65536)
                    except OSError:  # the terminal closed with the child
                        break
        finally:
            os.close(leader)
            if child.poll() is None:
                child.kill()
        assert child.wait(timeout=60) == 0, output[-2000:]
    return output.decode(errors="replace")


def test_progress_true_in_a_terminal_draws_a_bar_for_a_large_transfer(shared_cluster):
    text = _in_a_terminal(_SCRIPT, shared_cluster)
    assert "upload to device 0" in text and "read from device 0" in text
    assert f"read {float(2 * MIN_BYTES // 8)}" in text


@pytest.mark.timeout(120)
def test_a_sync_that_waits_shows_the_time_waited_in_a_terminal(shared_cluster):
    text = _in_a_terminal(_LONG_SYNC, shared_cluster)
    assert "long sync" in text
    assert "waiting for device 0: waited 00:0" in text


@pytest.mark.timeout(120)
def test_fabric_progress_0_turns_the_bars_off(shared_cluster):
    text = _in_a_terminal(_LONG_SYNC, shared_cluster, FABRIC_PROGRESS="0")
    assert "long sync" in text and "waiting" not in text
