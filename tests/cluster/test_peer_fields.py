"""Fields a peer chooses, against real processes: each has a bound, and a bad one is a typed
error for its sender, never a traceback in a log (issue 41, section 2, findings 4 and 10)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fabric
from fabric.core.errors import FabricError, ProtocolError, error_from_wire
from fabric.core.protocol import MAX_LABEL_CHARS, Kind
from fabric.core.shm import boot_id
from fabric.core.wire import dtype_name

from conftest import HEARTBEAT
from rawpeers import RawDealer, frames_of

pytestmark = pytest.mark.timeout(120)

HUGE_PID = "9" * 5000  # past the 4,300 digits int() takes from a string


@pytest.fixture(scope="module")
def one_worker():
    """A broker and one numpy worker, which keeps no segment ready for start slots (it makes
    the next once its device idles: that would show in the resident bytes measured here)."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--start-slot", "0")) as running:
        yield running


def test_a_segment_whose_pid_has_5000_digits_is_refused_without_a_traceback(one_worker):
    # Finding 10: int() refused the pid (ValueError, not ProtocolError), so the worker logged
    # a full traceback per message: 400 probes made 9,600 lines.
    bad = f"fabric-{boot_id()}-{HUGE_PID}-0"
    with one_worker.connect() as session:
        session.asarray(np.zeros(MiB_ELEMENTS))  # (a slot's worth: the session probes)
        tensor = session.arange(4.0)
        for _ in range(200):
            with pytest.raises(ProtocolError, match="fabric segment"):
                session._call({"op": "shm_probe", "boot": boot_id(), "segment": bad,
                               "token": 1})
            with pytest.raises(FabricError) as info:
                session._call({"op": "read_into", "id": tensor.id,
                               "dtype": dtype_name(tensor.dtype), "shape": [4],
                               "into": [bad, 0, 32]})
            assert type(info.value) is ProtocolError, info.value
        assert tensor.sum().numpy() == 6.0  # the session goes on
    with one_worker.connect() as bystander:
        assert bystander.arange(5).sum().numpy() == 10
    log = one_worker.log_tail("worker-0", 100_000)
    assert "Traceback" not in log and "ValueError" not in log, log[-2000:]
    assert len(log.splitlines()) < 50, log[-2000:]


MiB_ELEMENTS = (1 << 20) // 8


def resident(pid: int) -> int:
    """A process's resident bytes now."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmRSS:"))


def test_a_hello_whose_client_label_is_huge_is_refused_and_nothing_keeps_it(one_worker):
    # Finding 4: HELLOs whose optional ``client`` label was 256 MiB each were admitted, and
    # the worker kept each label for its session's life (7 of them: worker OOM). Scaled to
    # 8 labels of 16 MiB.
    worker = one_worker.workers[0].pid
    before = resident(worker)
    with RawDealer(one_worker.address, one_worker.token) as peer:
        for request in range(1, 9):
            peer.send(frames_of(Kind.HELLO, {"token": one_worker.token, "device": 0,
                                             "client": "x" * (16 << 20)},
                                session=0x4E110 + request, request=request))
            answer = peer.recv_message(timeout=10)
            assert answer.kind in (Kind.ERROR, Kind.REJECT), answer.kind
            error = error_from_wire(answer.body)
            assert type(error) is ProtocolError and "client" in error.message, error
            assert "shorten" in error.message or "at most" in error.message, error.message
        for request, label in ((9, "x" * 1000), (10, "y" * 255)):  # past the label bound
            peer.send(frames_of(Kind.HELLO, {"token": one_worker.token, "device": 0,
                                             "client": label},
                                session=0x4E110 + request, request=request))
            answer = peer.recv_message(timeout=10)
            if len(label) > MAX_LABEL_CHARS:
                error = error_from_wire(answer.body)
                assert type(error) is ProtocolError and error.details["field"] == "client"
                assert "1000 characters long, more than the 255" in error.message
            else:  # (one within the bound opens its session)
                assert answer.kind is Kind.WELCOME, answer
    assert resident(worker) - before < 8 << 20
    with one_worker.connect() as bystander:
        assert bystander.arange(5).sum().numpy() == 10
    assert one_worker.broker.poll() is None and one_worker.workers[0].poll() is None


def test_a_worker_name_past_the_label_bound_is_refused_by_the_broker_and_the_cli(one_worker):
    # The same bound on what a worker chooses (a name the broker keeps and shows): a raw
    # peer holding the worker token is refused, and `fabric worker --name` says so at once.
    with RawDealer(one_worker.worker_address, one_worker.worker_token) as peer:
        peer.send(frames_of(Kind.REGISTER, {
            "token": one_worker.worker_token, "name": "w" * 1000, "backend": "numpy",
            "devices": [{}]}, request=1))
        answer = peer.recv_message(timeout=10)
        error = error_from_wire(answer.body)
        assert type(error) is ProtocolError and error.details["field"] == "name", error
    assert [d.worker for d in one_worker.devices()] == ["worker-0"]  # nothing registered
    done = subprocess.run([sys.executable, "-m", "fabric", "worker", "--name", "w" * 300,
                           "--broker", "tcp://127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "at most 255 characters" in done.stderr, done.stderr
