"""Device indexes that never move: kept across broker restarts (``--state-file``) and
retired only by an operator (``fabric admin forget``) (issue 24, section 1)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import HEARTBEAT
from polling import wait_for
from test_security import run_cli

import fabric
from fabric import LocalCluster
from fabric.broker.model import Worker
from fabric.broker.worker_table import WorkerTable
from fabric.core.errors import NotFound, WorkerNameTaken


def _worker(name: str, devices: int, identity: bytes) -> Worker:
    return Worker(identity=identity, name=name, backend="numpy", devices=[{}] * devices,
                  registered=0.0, last_seen=0.0)


# -- the numbering, sans I/O ---------------------------------------------------------------------

def test_the_numbering_round_trips_and_forget_retires_indexes_for_good():
    table = WorkerTable()
    for name, devices, identity in (("b", 2, b"B"), ("a", 1, b"A")):
        table.add(_worker(name, devices, identity))
    state = json.loads(json.dumps(table.state()))
    assert state == {"device_count": 3, "workers": {"b": [0, 1], "a": [2]}}
    again = WorkerTable()
    again.restore(state)
    again.add(_worker("a", 1, b"A2"))  # "a" comes back first: its index, not 0
    assert [d["index"] for d in again.devices] == [2]
    with pytest.raises(WorkerNameTaken, match="stop it first"):
        again.forget("a")
    with pytest.raises(NotFound, match="known: a, b"):
        again.forget("c")
    before = again.revision
    assert again.forget("b") == [0, 1]
    assert again.revision > before
    again.add(_worker("b", 2, b"B2"))  # a forgotten name starts afresh, after the highest
    assert sorted(d["index"] for d in again.devices) == [2, 3, 4]


@pytest.mark.parametrize("state", [
    {}, {"device_count": "3", "workers": {}}, {"device_count": 1, "workers": {"a": [1]}},
    {"device_count": 2, "workers": {"a": [0], "b": [0]}}, {"device_count": 1, "workers": []},
    [], "text",
])
def test_a_state_that_is_no_numbering_is_refused(state):
    with pytest.raises(ValueError, match="not a device numbering"):
        WorkerTable().restore(state)


# -- end to end -------------------------------------------------------------------------------

@pytest.fixture
def kept(tmp_path):
    """Two workers whose broker keeps its numbering in a state file."""
    path = tmp_path / "state.json"
    with LocalCluster(workers=2, heartbeat=HEARTBEAT,
                      broker_args=("--state-file", str(path))) as running:
        running.state_file = path
        yield running


def _indexes(cluster) -> dict[str, int]:
    return {d.worker: d.index for d in cluster.devices()}


def test_indexes_survive_a_broker_restart_whatever_order_workers_come_back_in(kept):
    assert _indexes(kept) == {"worker-0": 0, "worker-1": 1}
    assert json.loads(kept.state_file.read_text())["workers"] == {"worker-0": [0],
                                                                  "worker-1": [1]}
    assert oct(os.stat(kept.state_file).st_mode & 0o777) == "0o600"
    os.kill(kept.workers[0].pid, signal.SIGKILL)  # worker-0 will come back after worker-1
    kept.workers[0].wait(5)
    kept.restart_broker()
    wait_for(lambda: _indexes(kept) == {"worker-1": 1}, 10, "worker-1 back at index 1")
    with kept.connect(device=1, timeout=5) as session:
        assert session.device.worker == "worker-1"
    kept.start_worker(0)
    wait_for(lambda: _indexes(kept) == {"worker-0": 0, "worker-1": 1}, 10,
             "worker-0 back at index 0")


def test_admin_forget_retires_an_offline_workers_indexes(kept):
    path = kept.write_admin_file(kept.state_file.with_name("admin.json"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    online = run_cli("admin", "--admin-file", path, "forget", "worker-1", env=env)
    assert online.returncode == 1 and "stop it first" in online.stderr
    os.kill(kept.workers[1].pid, signal.SIGKILL)
    kept.workers[1].wait(5)
    wait_for(lambda: "worker-1" not in _indexes(kept), 10, "worker-1 to be lost")
    done = run_cli("admin", "--admin-file", path, "forget", "worker-1", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"worker": "worker-1", "indexes": [1]}
    wait_for(lambda: "worker-1" not in json.loads(kept.state_file.read_text())["workers"], 5,
             "the state file to forget worker-1")
    with pytest.raises(fabric.NoSuchDevice, match="Device 1 was retired") as retired:
        kept.connect(device=1, timeout=5)  # never back under that index: not "offline"
    assert "fabric admin forget" in retired.value.message
    kept.start_worker(1)  # the name again: new indexes, after the highest ever given
    wait_for(lambda: _indexes(kept) == {"worker-0": 0, "worker-1": 2}, 10, "worker-1 at 2")
    unknown = run_cli("admin", "--admin-file", path, "forget", "nobody", env=env)
    assert unknown.returncode == 1 and "No worker named 'nobody'" in unknown.stderr
