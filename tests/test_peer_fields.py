"""Fields a peer chooses, against real processes: each has a bound, and a bad one is a typed
error for its sender, never a traceback in a log (issue 41, section 2, findings 4 and 10)."""

from __future__ import annotations

import numpy as np
import pytest

import fabric
from fabric.errors import FabricError, ProtocolError
from fabric.shm import boot_id
from fabric.wire import dtype_name

from conftest import HEARTBEAT

pytestmark = pytest.mark.timeout(120)

HUGE_PID = "9" * 5000  # past the 4,300 digits int() takes from a string


@pytest.fixture(scope="module")
def one_worker():
    """A broker and one numpy worker."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as running:
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
