"""The jax device on a GPU: what only a GPU run can check (XLA's GPU arithmetic against
numpy's, arrays in GPU memory, transfers through host buffers). Everything else a jax device
does is tested on CPU (``test_jax_device.py``, the differential test). These tests skip on
the GPU count, never on an import: jax is in the test extra."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gpu_cluster, gpu_count
from hypothesis import given
from test_differential import EXAMPLES, chains, check, check_graph
from value_edges import CASES, check_on

GPUS = gpu_count("jax")
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no GPU that jax can use on this machine")


@pytest.fixture(scope="module")
def gpus():
    """A broker and one jax worker hosting every GPU."""
    with gpu_cluster("jax") as running:
        yield running


def test_every_gpu_is_a_device_with_its_memory(gpus):
    for index in range(GPUS):
        with gpus.connect(device=index) as session:
            settings = session.device.settings
            assert settings["platform"] == "gpu" and settings["memory_bytes"] > 0
            data = np.random.default_rng(index).random((1000, 1000))
            x = session.asarray(data)  # into GPU memory through a host buffer
            np.testing.assert_allclose((x @ x).numpy(), data @ data, rtol=1e-12)


@pytest.mark.parametrize("name, args, params", CASES)
def test_values_xla_computes_otherwise_are_numpys_on_a_gpu(gpu_session, name, args, params):
    check_on(gpu_session, name, args, params)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", [check, check_graph], ids=["streamed", "as a graph"])
@EXAMPLES
@given(chain=chains())
def test_random_chains_agree_with_numpy_on_a_gpu(gpu_session, run, chain):
    run(gpu_session, chain)
