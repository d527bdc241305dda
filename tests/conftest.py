"""Shared fixtures: real broker and worker processes on loopback, and leak checks.

The suite has two folders: ``unit/`` (sans I/O: state machines on a fake clock, codecs, the
op table; ``pytest tests/unit`` is the loop to run while editing) and ``cluster/`` (tests that
start broker, worker and launcher processes, or open sockets). Test modules of either folder
may import another's builders (a registry with sessions open, an executor's messages), so both
folders are on the import path whichever one pytest is given.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from polling import poll

import fabric
from fabric import LocalCluster
from fabric.core.worker_options import NUMEXPR_MIN_SIZE_ENV

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS / "unit"), str(TESTS / "cluster")]

# Short heartbeats keep fault tests fast; the code paths are the same as the defaults.
HEARTBEAT = 0.2
# A test pair's state beats: the backup may take over after 0.6 s of the primary's silence
PAIR_HEARTBEAT, PAIR_LIVENESS = 0.2, 3


def child_pids() -> set[int]:
    """Live child processes of this test process (zombies excluded)."""
    return children_of(os.getpid())


def children_of(pid: int) -> set[int]:
    """Live child processes of ``pid`` (zombies excluded)."""
    me = str(pid)
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def our_threads() -> set[threading.Thread]:
    # pyzmq's zero-copy garbage collector is one thread per process, started on first use.
    return {t for t in threading.enumerate() if type(t).__name__ != "GarbageCollectorThread"}


@pytest.fixture(autouse=True)
def no_leaks():
    """Every test ends the processes and threads it started (module fixtures excepted)."""
    children_before = child_pids()
    threads_before = our_threads()
    yield
    poll(lambda: not (child_pids() - children_before or our_threads() - threads_before), 5)
    assert not child_pids() - children_before, "the test left child processes running"
    assert not our_threads() - threads_before, "the test left threads running"


def assert_broker_serves(cluster) -> None:
    """Nothing was left behind: both devices listed, and a session on each opens and syncs."""
    assert cluster.broker.poll() is None, cluster.log_tail("broker", 50)
    listed = fabric.devices(cluster.address, token=cluster.token, timeout=5)
    assert [d.worker for d in listed] == ["worker-0", "worker-1"]
    for device in (0, 1):
        with cluster.connect(device=device, timeout=5) as session:
            session.sync()


@pytest.fixture(scope="module")
def shared_cluster():
    """One broker and two workers for a whole module of tests that do not harm them."""
    with LocalCluster(workers=2, heartbeat=HEARTBEAT) as running:
        yield running


@pytest.fixture
def session(shared_cluster):
    """A fresh session on device 0 of the shared cluster, closed after the test."""
    with shared_cluster.connect(device=0) as opened:
        yield opened


@pytest.fixture
def cluster():
    """A broker and two one-device numpy workers, with short heartbeats."""
    with LocalCluster(workers=2, heartbeat=HEARTBEAT) as running:
        yield running


@pytest.fixture(scope="module")
def numexpr_session():
    """A session on a numexpr device that fuses chains of every size (these are small)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NUMEXPR_MIN_SIZE_ENV, "0")  # (the worker's environment is this process's)
        with LocalCluster(workers=1, backend="numexpr", heartbeat=HEARTBEAT) as cluster, \
                cluster.connect() as session:
            yield session


@pytest.fixture(scope="module")
def jax_cluster():
    """A broker and one jax worker (XLA on this host's CPU; jax is in the test extra), with
    the default heartbeats: XLA compiles each new op signature on cores other tests share."""
    with LocalCluster(workers=1, backend="jax") as running:
        yield running


@pytest.fixture
def jax_session(jax_cluster):
    """A fresh session on the jax device, closed after the test."""
    with jax_cluster.connect() as opened:
        yield opened


# How each GPU backend counts the GPUs it can use, printed by a child process
_GPU_PROBES = {
    "cupy": ("import cupy\ntry: print(cupy.cuda.runtime.getDeviceCount())\n"
             "except cupy.cuda.runtime.CUDARuntimeError: print(0)"),
    "jax": "import jax; print(sum(d.platform == 'gpu' for d in jax.devices()))"}


@functools.lru_cache(maxsize=None)
def gpu_count(backend: str) -> int:
    """How many GPUs ``backend`` ("cupy" or "jax") can use on this machine, asked in a child
    process, so that this one holds no CUDA context or GPU memory that the workers need: 0
    where the module finds none, or is missing (nothing printed). GPU tests skip on this
    count, never on an import."""
    probe = subprocess.run([sys.executable, "-c", _GPU_PROBES[backend]], capture_output=True,
                           text=True, timeout=120)
    return int(probe.stdout.strip() or 0)


def gpu_cluster(backend: str, *worker_args: str) -> LocalCluster:
    """A broker and one ``backend`` worker hosting every GPU that ``gpu_count`` finds, with
    ``worker_args``; a context manager, as LocalCluster is."""
    return LocalCluster(workers=1, backend=backend, devices_per_worker=gpu_count(backend),
                        worker_args=worker_args)


@pytest.fixture
def gpu_session(gpus):
    """A fresh session on GPU 0 of the test module's ``gpus`` cluster (a ``gpu_cluster``)."""
    with gpus.connect() as opened:
        yield opened


def broker_pair(tmp_path: Path, *broker_args: str, workers: int = 1,
                **cluster_args: object) -> LocalCluster:
    """A primary and a backup broker (``LocalCluster(standby=True)``) with short heartbeats
    and the pair's short state beats (``broker_args`` added to them), logging under
    ``tmp_path``; a context manager, as LocalCluster is."""
    return LocalCluster(workers=workers, standby=True, heartbeat=HEARTBEAT,
                        log_dir=tmp_path / "logs", broker_args=(
                            "--pair-heartbeat", str(PAIR_HEARTBEAT),
                            "--pair-liveness", str(PAIR_LIVENESS), *broker_args),
                        **cluster_args)
