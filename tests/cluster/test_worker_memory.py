"""A worker's memory budget (issue 30, High 3): sans-I/O rules, then the attacks themselves
against real processes held in a memory cgroup, so that an op the budget let through would
get the worker killed by the kernel, not the test machine's memory exhausted."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from test_executor import SESSION, read, request, submit

from fabric import LocalCluster
from fabric.core.errors import QuotaExceeded, error_from_wire
from fabric.core.protocol import Kind, Message
from fabric.core.worker_options import available_memory, budget_from_option, parse_size
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor
from fabric.workers.memory import MemoryBudget, inferred_need

MiB = 1 << 20


def budgeted(limit: int) -> Executor:
    executor = Executor(NumpyDevice(0), budget=MemoryBudget(limit))
    assert executor.handle(Message(Kind.OPEN, SESSION, 1, {}))[0].kind == Kind.OPENED
    return executor


def error_of(executor: Executor, tensor_id: int) -> QuotaExceeded:
    reply = request(executor, op="read", id=tensor_id)
    return error_from_wire(reply.body["error"])


# -- sans I/O ---------------------------------------------------------------------------

def test_an_op_past_the_budget_is_refused_before_it_runs_and_names_op_and_bytes():
    executor = budgeted(MiB)
    submit(executor, ["ones", 1, [], {"shape": [20000, 20000], "dtype": "<f8"}],
           ["ones", 2, [], {"shape": [10], "dtype": "<f8"}])
    error = error_of(executor, 1)
    assert isinstance(error, QuotaExceeded) and error.details["op"] == "ones"
    assert error.details["requested"] >= 20000 * 20000 * 8
    assert "ones needs" in error.message and "--memory-budget" in error.message
    assert read(executor, 2).sum() == 10  # the session goes on
    assert executor.allowance.held == 80


@pytest.mark.parametrize("ops", [
    [["multiply", 3, [1, 2], {}]],  # broadcasting (20000, 1) by (1, 20000): 3.2 GB
    [["matmul", 3, [1, 2], {}]],  # (20000, 1) @ (1, 20000)
    [["sum", 4, [5], {"axis": 0}]],  # an empty (0, 10**9) array's sum: 8 GB of zeros
    [["broadcast_to", 3, [1], {"shape": [20000, 20000]}], ["copy", 4, [3], {}]],
], ids=["broadcast", "matmul", "reduction-of-empty", "copy-of-broadcast"])
def test_ops_whose_result_outgrows_their_inputs_are_refused(ops):
    executor = budgeted(4 * MiB)
    submit(executor, ["ones", 1, [], {"shape": [20000, 1], "dtype": "<f8"}],
           ["ones", 2, [], {"shape": [1, 20000], "dtype": "<f8"}],
           ["zeros", 5, [], {"shape": [0, 10**9], "dtype": "<f8"}], *ops)
    assert isinstance(error_of(executor, ops[-1][1]), QuotaExceeded)


def test_uploads_transfers_and_graph_calls_past_the_budget_are_refused():
    executor = budgeted(MiB)
    big = np.ones(MiB // 4)  # 2 MiB
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [big.size], "buffer": 0}],
           buffers=(big.tobytes(),))
    assert error_of(executor, 1).details["op"] == "put"
    executor.handle(Message(Kind.REQUEST, SESSION, 1, {"op": "expect", "id": 2, "ticket": 9}))
    executor.handle(Message(Kind.TRANSFER, SESSION, 0, {"ticket": 9, "dtype": "<f8",
                                                         "shape": [big.size]}, (big,)))
    assert error_of(executor, 2).details["op"] == "to"
    submit(executor, ["ones", 3, [], {"shape": [1000], "dtype": "<f8"}],
           ["graph_register", 0, [], {"graph": 7, "name": "outer", "inputs": [[[1000], "<f8"]],
                                      "ops": [["reshape", 2, [1], {"shape": [1000, 1]}],
                                              ["multiply", 3, [2, 1], {}]], "outputs": [3]}],
           ["graph_call", 4, [3], {"graph": 7, "outputs": 1}])
    error = error_of(executor, 4)
    assert isinstance(error, QuotaExceeded) and "graph 'outer'" in error.message


def test_an_ops_inferred_need_is_remembered_per_signature_scalars_and_params_included():
    small, large = np.ones((4, 8), np.int8), np.ones((40, 8), np.int8)
    # (asked twice each, in turns: a signature that left out a scalar's type, an input's
    # shape or a param would answer the second question with the first's bytes)
    for _ in range(2):
        assert inferred_need("multiply", [small, 2], {})[0] == small.size  # int8 kept
        assert inferred_need("multiply", [small, 2.5], {})[0] == small.size * 8  # float64
        assert inferred_need("multiply", [large, 2], {})[0] == large.size
        assert inferred_need("sum", [large], {"axis": 0})[0] == 8 * 8
        assert inferred_need("sum", [large], {"axis": 1})[0] == 40 * 8
        assert inferred_need("matmul", [small, large.T], {})[0] == 4 * 40
    with pytest.raises(ValueError):  # (not remembered: asked again, it raises again)
        inferred_need("matmul", [small, large], {})
    with pytest.raises(ValueError):
        inferred_need("matmul", [small, large], {})


def test_frees_and_closes_give_the_budget_back():
    executor = budgeted(MiB)
    for round_ in range(3):  # 400 kB each, admitted for 800 kB: one at a time
        submit(executor, ["ones", 1, [], {"shape": [50000], "dtype": "<f8"}])
        assert read(executor, 1).size == 50000, round_
        submit(executor, ["ones", 2, [], {"shape": [50000], "dtype": "<f8"}])
        assert isinstance(error_of(executor, 2), QuotaExceeded)
        submit(executor, 1, 2)
    submit(executor, ["ones", 1, [], {"shape": [50000], "dtype": "<f8"}])
    executor.handle(Message(Kind.CLOSE, SESSION, 2))
    assert executor.allowance.held == 0


def test_the_devices_of_one_worker_share_its_budget():
    budget = MemoryBudget(10 * MiB, devices=2)
    first, second = budget.allowance(), budget.allowance()
    assert first.fits(6 * MiB)
    first.held += 6 * MiB
    assert not second.fits(6 * MiB)  # 12 MiB in all
    assert second.fits(3 * MiB)
    first.held -= 6 * MiB
    first.settle()  # what it no longer holds goes back
    assert second.fits(6 * MiB)
    assert budget.held() == 0 and sum(a.granted for a in budget.allowances) <= 10 * MiB


def test_budget_option_takes_sizes_and_percentages():
    assert parse_size("512MiB") == 512 * MiB and parse_size("2G") == 2 << 30
    assert parse_size("1000") == 1000 and parse_size("1.5kb") == 1500
    assert budget_from_option("25%", available=1000) == 250
    for bad in ("lots", "0", "150%", "-5%", "12XB"):
        with pytest.raises(ValueError, match="size|percentage|more than 0"):
            budget_from_option(bad, available=1000)


def test_available_memory_is_the_least_of_meminfo_and_each_cgroup_left(tmp_path):
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 4000000 kB\nMemAvailable: 2000000 kB\n")
    (proc / "self" / "cgroup").write_text("4:memory:/a/b\n0::/c\n")
    v1 = cgroups / "memory" / "a" / "b"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(1 << 63))  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text("0")
    (v1.parent / "memory.limit_in_bytes").write_text(str(900 * MiB))
    (v1.parent / "memory.usage_in_bytes").write_text(str(100 * MiB))
    assert available_memory(proc, cgroups) == 800 * MiB
    v2 = cgroups / "c"
    v2.mkdir()
    (cgroups / "cgroup.controllers").write_text("memory\n")
    (v2 / "memory.max").write_text(str(300 * MiB))
    (v2 / "memory.current").write_text(str(100 * MiB))
    assert available_memory(proc, cgroups) == 200 * MiB
    (v2 / "memory.max").write_text("max\n")
    assert available_memory(proc, cgroups) == 800 * MiB


# -- end to end, in a memory cgroup -----------------------------------------------------

class MemoryCgroup:
    """A memory cgroup made for one test under this process's own (v2, else v1), removed
    after; ``skip_reason`` says why none can be made here."""

    def __init__(self, limit: int) -> None:
        self.path: Path | None = None
        self.skip_reason = ""
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        v2 = {c: p for _, c, p in (line.split(":", 2) for line in lines)}
        v2_root = Path("/sys/fs/cgroup")
        if not (v2_root / "cgroup.controllers").exists():
            v2_root = v2_root / "unified"
        if "memory" in _read(v2_root / v2.get("", "/").lstrip("/") / "cgroup.controllers"):
            parent, limit_file = v2_root / v2[""].lstrip("/"), "memory.max"
        elif "memory" in v2:
            parent, limit_file = Path("/sys/fs/cgroup/memory") / v2["memory"].lstrip("/"), \
                "memory.limit_in_bytes"
        else:
            self.skip_reason = "no memory cgroup controller (v2 or v1) on this machine"
            return
        path = parent / f"fabric-test-{uuid.uuid4().hex[:8]}"
        try:
            path.mkdir()
            (path / limit_file).write_text(str(limit))
        except OSError as exc:
            self.skip_reason = f"cannot make a memory cgroup under {parent}: {exc}"
            if path.exists():
                path.rmdir()
            return
        self.path = path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        if self.path is not None:
            for pid in _read(self.path / "cgroup.procs").split():  # (ended by their test)
                raise AssertionError(f"process {pid} is still in {self.path}")
            self.path.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def memory_cgroup():
    group = MemoryCgroup(384 * MiB)  # a worker's own needs, one message, and a 64 MiB budget
    if group.path is None:
        pytest.skip(group.skip_reason)
    yield group
    group.remove()


def test_the_attacks_get_quota_exceeded_and_the_worker_serves_on(memory_cgroup):
    with LocalCluster(workers=1, worker_args=("--memory-budget", "64MiB")) as cluster:
        worker = cluster.workers[0]
        memory_cgroup.add(worker.pid)
        with cluster.connect() as session, cluster.connect() as other:
            kept = other.arange(1000)
            huge = session.ones((20000, 20000))  # 3.2 GB: killed the worker before
            with pytest.raises(QuotaExceeded, match="ones needs .* --memory-budget"):
                huge.numpy()
            upload = session.asarray(np.ones(16 * MiB))  # 128 MiB
            with pytest.raises(QuotaExceeded, match="upload"):
                upload.numpy()
            assert session.ones(1000).sum().numpy() == 1000  # the same session goes on
            assert kept.sum().numpy() == 499500  # and the other one
        with cluster.connect() as fresh:
            assert fresh.arange(5).sum().numpy() == 10
        assert worker.poll() is None and cluster.workers[0] is worker


def test_an_embedded_cluster_shares_its_budget_among_its_workers():
    # Two workers of a 64 MiB cluster take 32 MiB each: together never more than promised.
    with LocalCluster(workers=2, memory_budget="64MiB") as cluster:
        for device in (0, 1):
            with cluster.connect(device=device) as session:
                assert session.ones(MiB).sum().numpy() == MiB  # 8 MiB (and its sum) fits
                with pytest.raises(QuotaExceeded, match="--memory-budget"):
                    session.ones(5 * MiB).numpy()  # 40 MiB, under the cluster's 64, does not
    with pytest.raises(ValueError):
        LocalCluster(workers=1, memory_budget="lots")
