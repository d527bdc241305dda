"""The cupy device where no GPU is: ``fabric worker --backend cupy`` exits 2 within seconds
with a sentence naming what is missing (CuPy, or a CUDA device) and what to install or run
instead, in real worker processes. What the cupy device computes is tested on a GPU
(``test_cupy_gpu.py``) and, for its code that is not CUDA's, on this CPU
(``tests/unit/test_cupy_ops.py``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(90)


def _worker(*prelude: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                      float]:
    """``fabric worker --backend cupy`` run in a child Python (after ``prelude``), and how
    long it took."""
    code = "; ".join([*prelude, "from fabric.cli.main import main",
                      "main(['worker', '--backend', 'cupy', '--broker', 'tcp://127.0.0.1:1'])"])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "FABRIC_WORKER_TOKEN": "t" * 32,
                                           **(env or {})})
    return done, time.monotonic() - started


def test_a_cupy_worker_without_cupy_exits_2_within_seconds_naming_the_extra():
    done, took = _worker("import sys", "sys.modules['cupy'] = None")  # (as where not installed)
    assert done.returncode == 2, done.stderr
    assert took < 15
    assert "cupy is not installed" in done.stderr and "fabric-arrays[cupy]" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                    reason="CuPy is not installed here (no test dependency: the [cupy] extra)")
def test_a_cupy_worker_where_cuda_finds_no_device_exits_2_within_seconds_saying_so():
    # (no device visible to CUDA: as on a machine without a GPU, on one with GPUs too)
    done, took = _worker(env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2, done.stderr
    assert took < 15
    assert "finds no CUDA device" in done.stderr and "--backend numpy" in done.stderr


def test_a_cupy_worker_starts_its_own_processes_with_spawn_never_fork():
    probe = ("import multiprocessing; from fabric.workers.backends import prepare; "
             "prepare('cupy', 1); print(multiprocessing.get_start_method())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawn"
