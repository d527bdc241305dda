"""Progress of large uploads and reads (``fabric.arrays.progress``) on a real cluster: a callable
is told only bytes that arrived, chunk by chunk; ``progress=True`` draws a bar in a real
terminal (a pseudo-terminal) and changes nothing where there is none."""

from __future__ import annotations

import math
import os
import pty
import select
import subprocess
import sys

import numpy as np

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


def test_progress_true_in_a_terminal_draws_a_bar_for_a_large_transfer(shared_cluster):
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen([sys.executable, "-c", _SCRIPT, shared_cluster.address,
                           shared_cluster.token], stdin=follower, stdout=follower,
                          stderr=follower, env=env) as child:
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
    text = output.decode(errors="replace")
    assert "upload to device 0" in text and "read from device 0" in text
    assert f"read {float(2 * MIN_BYTES // 8)}" in text
