"""Rough edges a data scientist and an operator hit (issue 47), each tried as they would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import HEARTBEAT
from polling import wait_for

import fabric
from fabric.launch.supervision import ended_how

# A value that shows in any message that printed the tensor's elements.
TELLTALE = 7777.25


def test_a_clone_named_fabric_hands_a_script_above_it_the_installed_package(tmp_path):
    # (git clone ... names the folder fabric; a script beside it found the clone's root, a
    # namespace package, before an editable install: fabric.connect was an AttributeError)
    (tmp_path / "fabric").symlink_to(Path(__file__).resolve().parents[2])
    script = "import fabric; print(fabric.__file__, fabric.connect.__name__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [fabric.__file__, "connect"]
    # With no fabric installed (-S: no site-packages), a sentence names the folder
    bare = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 1
    assert (f"ImportError: {tmp_path / 'fabric'} is a clone of fabric's repository, not the "
            "fabric package") in bare.stderr and "pip install fabric-arrays" in bare.stderr


def test_an_error_about_another_sessions_tensor_names_both_and_reads_nothing(cluster):
    with fabric.connect(cluster.address, token=cluster.token, timeout=10) as first, \
            first.open(0) as second:
        theirs = second.asarray(np.full((300, 300), TELLTALE))
        mine = first.asarray(np.ones((300, 300)))
        attempts = [lambda: mine + theirs, lambda: first.asarray(theirs),
                    lambda: fabric.function(lambda a, b: a * b)(mine, theirs)]
        for attempt in attempts:
            with pytest.raises(ValueError) as refused:
                attempt()
            message = str(refused.value)
            assert "7777" not in message and len(message) < 400, message
            assert f"session={second.id:#x}" in message and "shape=(300, 300)" in message
            assert "move it with .to(session)" in message
        # (the advice works)
        assert float((mine + theirs.to(first)).numpy()[0, 0]) == TELLTALE + 1


def test_no_error_message_reads_a_tensor(cluster):
    with fabric.connect(cluster.address, token=cluster.token, timeout=10) as first, \
            first.open(1) as second, cluster.admin() as admin:
        t, mine = first.asarray(np.arange(6.)), first.asarray(np.ones(6))
        value, half = first.asarray(np.float64(TELLTALE)), first.asarray(np.full(3, TELLTALE,
                                                                                 np.float16))
        theirs = second.asarray(np.full(6, TELLTALE))
        xp = t.__array_namespace__()
        first.sync(), second.sync()
        messages = {row["id"]: row["messages"] for row in admin.sessions()}
        wrong = [  # (each a tensor where something else belongs)
            lambda: first.open(device=value), lambda: first.zeros(value),
            lambda: first.mesh(devices=value), lambda: xp.zeros(3, device=value),
            lambda: xp.astype(t, half), lambda: mine + theirs, lambda: first.asarray(theirs),
            lambda: fabric.function(lambda a, b: a * b)(mine, theirs)]
        for call in wrong:
            with pytest.raises((TypeError, ValueError)) as refused:
                call()
            assert "7777" not in str(refused.value) and "<fabric.Tensor shape=" in str(
                refused.value), refused.value
        # Not one message more from either session: no read
        assert {row["id"]: row["messages"] for row in admin.sessions()} == messages


def test_an_upload_counts_its_bytes_whichever_way_they_went(cluster):
    # (a 12.8 MB upload through shared memory once said bytes_uploaded: 120)
    with fabric.connect(cluster.address, token=cluster.token, timeout=10) as session:
        big, small = np.ones(1_600_000), np.ones(10)
        session.asarray(big), session.asarray(small)
        stats = session.stats()
    assert stats["bytes_uploaded"] == big.nbytes + small.nbytes
    assert stats["bytes_uploaded_by_socket"] == small.nbytes
    assert stats["bytes_uploaded_by_shared_memory"] == big.nbytes


def test_a_quota_error_gives_its_sizes_in_binary_units_beside_the_exact_count():
    with fabric.LocalCluster(workers=1, worker_args=("--memory-limit", str(3 << 20))) as small:
        with fabric.connect(small.address, token=small.token, timeout=10) as session:
            t = session.zeros((1024, 1024))  # 8 MiB: past the limit
            with pytest.raises(fabric.QuotaExceeded) as refused:
                t.numpy()
    message = refused.value.message
    assert "8.0 MiB (8,388,608 bytes)" in message and "3.0 MiB (3,145,728 bytes)" in message


@pytest.mark.parametrize("command", [
    ["broker", "--advertise", "tcp://10.0.0.1:5555"],
    ["broker", "--advertise", "10.0.0.1:5555"],
    ["broker", "--advertise", "0.0.0.0"],
    ["cluster", "up", "--advertise", "tcp://10.0.0.1:5555"],
    ["cluster", "up", "--advertise", "::"],
    ["worker", "--broker", "tcp://tcp://10.0.0.1:5555:5556"],
    ["worker", "--broker", "10.0.0.1:5556"],
])
def test_an_unusable_address_stops_the_command_at_once_with_a_sentence(command):
    # (cluster up --advertise tcp://... started workers that died dialling tcp://tcp://...)
    done = subprocess.run([sys.executable, "-m", "fabric", *command], capture_output=True,
                          text=True, timeout=30,
                          env={**os.environ, "FABRIC_TOKEN": "t", "FABRIC_WORKER_TOKEN": "t"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "give a host name or address" in done.stderr or "give tcp://HOST:PORT" in done.stderr


def test_a_port_in_use_is_said_once_with_a_hint():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "fabric", "cluster", "up", "--frontend",
                               f"tcp://127.0.0.1:{port}", "--workers", "1"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "FABRIC_TOKEN": "t"})
    assert done.returncode == 1
    assert done.stderr.count("Error:") == 1, done.stderr
    assert "tcp://127.0.0.1:* picks a free one" in done.stderr


def test_how_a_process_ended_names_the_signal_that_killed_it():
    assert ended_how(1) == "exited with code 1"
    assert ended_how(-9) == "was killed by SIGKILL (exit code -9)"
    assert ended_how(-15) == "was killed by SIGTERM (exit code -15)"


def test_a_worker_restarted_after_its_process_died_is_accepted_at_its_first_registration():
    """Its old instance's connection closed, the broker asks that instance's beacon at once
    and finds it gone: the new instance's REGISTER is never refused as WorkerNameTaken."""
    with fabric.LocalCluster(workers=1, heartbeat=1.0) as cluster:
        cluster.workers[0].send_signal(signal.SIGKILL)
        cluster.workers[0].wait(5)
        restarted = time.monotonic()
        cluster.start_worker(0)
        with cluster.admin() as admin:
            wait_for(lambda: [w["registered_ago"] < time.monotonic() - restarted
                              for w in admin.workers()] == [True], 30,
                     "the new worker-0 to register")
            assert admin.status()["rejects"].get("worker_name_taken", 0) == 0
        assert "belongs to a live worker" not in cluster.log_tail("worker-0", 50)
        with cluster.connect(device=0, timeout=10) as session:
            assert session.arange(3).sum().numpy() == 3


def test_a_session_its_user_closed_says_closed_not_lost(cluster):
    session = fabric.connect(cluster.address, token=cluster.token, timeout=10)
    t = session.ones(3)
    session.asarray(np.ones(1 << 18))  # (the shared-memory path, agreed to)
    session.close()
    large = np.ones(1 << 18)  # (2 MiB: an upload that would send a slot's request first)
    for use in (lambda: t + 1, t.numpy, session.sync, lambda: session.zeros(2),
                lambda: session.asarray(large), lambda: t.numpy(out=np.zeros(3))):
        with pytest.raises(fabric.SessionClosed, match="is closed: open a new session"):
            use()
    assert issubclass(fabric.SessionClosed, fabric.SessionLost)  # (handlers of a loss see it)


def test_a_trace_replays_on_a_numpy_array_which_it_uploads(cluster, tmp_path):
    with fabric.connect(cluster.address, token=cluster.token, timeout=10) as first, \
            first.open(1) as other:
        x = first.asarray(np.zeros(6))
        with fabric.capture(first) as trace:
            y = x * 2 + 1
        trace.save(tmp_path / "trace")
        replayed = fabric.Trace.load(tmp_path / "trace").replay(other, np.arange(6.))
        assert replayed[x.id].session is other and replayed[y.id].session is other
        np.testing.assert_array_equal(replayed[y.id].numpy(), np.arange(6.) * 2 + 1)
        with pytest.raises(ValueError, match="lives on another session"):
            trace.replay(other, x)  # (a tensor must be the session's own)


def test_a_default_mesh_leaves_out_draining_devices_and_says_so(cluster):
    with cluster.admin() as admin, cluster.connect() as session:
        admin.drain("worker-1")
        assert [d.draining for d in session.devices()] == [False, True]
        assert "draining=True" in repr(fabric.devices(cluster.address, token=cluster.token))
        with pytest.warns(UserWarning, match=r"leaves out device\(s\) 1: draining"):
            mesh = session.mesh()
        assert mesh.devices == (0,) and "skipped_draining=[1]" in repr(mesh)
        np.testing.assert_array_equal(mesh.asarray(np.arange(4.)).numpy(), np.arange(4.))
        admin.drain("worker-0")
        with pytest.raises(fabric.DeviceDraining, match=r"Every online device is draining"):
            session.mesh()
        admin.undrain("worker-1")
        assert [d.draining for d in session.devices()] == [True, False]


# A client that opens a session on each device and one more over it, then waits (a line
# on stdin, or its end) without closing any.
OPENER = """
import sys, fabric
session = fabric.connect(sys.argv[1], token=sys.argv[2], timeout=10)
session.open(1).open(0).ones(3)
print("open", flush=True)
sys.stdin.readline()
"""


def test_sessions_end_with_the_session_that_opened_them_and_with_their_process(cluster):
    with cluster.admin() as admin:
        with cluster.connect() as parent:
            child = parent.open(1)
            grandchild = child.open(0)
            assert len(admin.sessions()) == 3
        assert child.closed and grandchild.closed and admin.sessions() == []
        for ends in ("exits", "is killed"):
            with subprocess.Popen([sys.executable, "-W", "always::ResourceWarning", "-c",
                                   OPENER, cluster.address, cluster.token], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) as opener:
                try:
                    assert opener.stdout.readline() == "open\n", opener.stderr.read()
                    assert len(admin.sessions()) == 3
                    if ends == "exits":  # closed at exit: gone once it has ended
                        _, errors = opener.communicate("\n", timeout=30)
                        assert opener.returncode == 0 and "ResourceWarning" not in errors, \
                            errors
                        assert admin.sessions() == []
                    else:  # no exit handler runs: the broker finds its connection gone
                        opener.kill()
                        opener.wait(timeout=30)
                        wait_for(lambda: admin.sessions() == [], 2 * HEARTBEAT + 0.5,
                                 "the broker to end a killed client's sessions")
                finally:
                    opener.kill()
