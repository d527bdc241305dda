"""The jax device on a GPU: what only a GPU run can check (XLA's GPU arithmetic against
numpy's, arrays in GPU memory, transfers through host buffers). Everything else a jax device
does is tested on CPU (``test_jax_device.py``, the differential test). These tests skip on
the GPU count, never on an import: jax is in the test extra."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from test_differential import EXAMPLES, chains, check, check_graph

from fabric import LocalCluster

# How many GPUs jax finds, asked in a child process: jax in this one would take GPU memory
# the workers need.
_PROBE = "import jax; print(sum(d.platform == 'gpu' for d in jax.devices()))"
GPUS = int(subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=120).stdout.strip() or 0)
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no GPU that jax can use on this machine")


@pytest.fixture(scope="module")
def gpu_cluster():
    """A broker and one jax worker hosting every GPU."""
    with LocalCluster(workers=1, backend="jax", devices_per_worker=GPUS) as running:
        yield running


@pytest.fixture
def gpu_session(gpu_cluster):
    """A fresh session on GPU 0."""
    with gpu_cluster.connect() as opened:
        yield opened


def test_every_gpu_is_a_device_with_its_memory(gpu_cluster):
    for index in range(GPUS):
        with gpu_cluster.connect(device=index) as session:
            settings = session.device.settings
            assert settings["platform"] == "gpu" and settings["memory_bytes"] > 0
            data = np.random.default_rng(index).random((1000, 1000))
            x = session.asarray(data)  # into GPU memory through a host buffer
            np.testing.assert_allclose((x @ x).numpy(), data @ data, rtol=1e-12)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", [check, check_graph], ids=["streamed", "as a graph"])
@EXAMPLES
@given(chain=chains())
def test_random_chains_agree_with_numpy_on_a_gpu(gpu_session, run, chain):
    run(gpu_session, chain)
