"""The backend contract (``fabric.workers.backends.base``): what a device must define, what it
inherits, and that backends are loaded by name only when asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_executor import opened, read, submit

from fabric.core.errors import BackendMissing, DeviceNotHostable
from fabric.core.ops import Op
from fabric.workers.backends import BACKENDS, device_class
from fabric.workers.backends.base import Backend

REPO = Path(__file__).resolve().parents[2]


class MinimalDevice(Backend):
    """A backend that defines only what it must: every other hook is the contract's default."""

    backend = "minimal"

    def settings(self) -> dict[str, Any]:
        return {"backend": self.backend}

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> np.ndarray:
        return np.asarray(op.impl(*inputs, **params))


def test_every_backend_implements_the_contract():
    for name in BACKENDS:
        try:
            cls = device_class(name)
        except BackendMissing as exc:  # (the test extra installs every backend but the GPU's,
            assert name == "cupy", exc.message  # which a host without a GPU refuses)
            continue
        assert issubclass(cls, Backend) and cls.backend == name
        device = cls(0)  # (a jax device's index is one of the XLA devices this process has)
        assert device.index == 0 and device.settings()["backend"] == name
        assert (device.ops_fused, device.expressions_evaluated) == (0, 0)


def test_a_backend_with_only_settings_and_run_serves_ops_and_graphs():
    executor = opened(device=MinimalDevice(0))
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [3], "buffer": 0}],
           ["multiply", 2, [1, [2.0]], {}],
           ["graph_register", 0, [], {"graph": 1, "name": "axpy", "inputs": [[[3], "<f8"]],
                                      "ops": [["multiply", 2, [1, 3.0], {}],
                                              ["add", 3, [2, 1], {}]],
                                      "outputs": [3]}],
           ["graph_call", 5, [2], {"graph": 1, "outputs": 1}],
           buffers=(np.arange(3.0).tobytes(),))
    np.testing.assert_array_equal(read(executor, 2), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(read(executor, 5), [0.0, 8.0, 16.0])  # 2x*3 + 2x


def test_a_random_op_in_a_graph_reaches_a_backends_run_with_the_sessions_generator():
    executor = opened(device=MinimalDevice(0))
    draw = {"shape": [4], "low": 0.0, "high": 1.0, "dtype": "float64"}
    submit(executor, ["seed", 0, [], {"seed": 5}],
           ["graph_register", 0, [], {"graph": 1, "name": "draw", "inputs": [],
                                      "ops": [["uniform", 1, [], draw]], "outputs": [1]}],
           ["graph_call", 2, [], {"graph": 1, "outputs": 1}])
    np.testing.assert_array_equal(read(executor, 2), np.random.default_rng(5).uniform(size=4))


def test_unknown_and_unhostable_backends_are_refused_by_name():
    with pytest.raises(ValueError, match="choose one of cupy, jax, numexpr, numpy"):
        device_class("tpu")
    with pytest.raises(DeviceNotHostable, match="--backend numpy"):
        device_class("capture")


def test_a_numpy_worker_does_not_load_numexpr_jax_nor_cupy():
    probe = ("import sys; from fabric.workers.control_io import Worker; "
             "from fabric.workers.backends import device_class; device_class('numpy')(0); "
             "print(sorted(m for m in sys.modules if 'numexpr' in m or 'jax' in m "
             "or 'cupy' in m))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
