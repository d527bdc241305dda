"""The cupy device on NVIDIA GPUs: the tensor, update and graph suites and the differential
test run on it, its memory pool held to --memory-limit, its transfers through the pinned
buffers, its elementwise graphs fused. These tests skip on the GPU count, never on an
import: where CuPy is missing, or finds no CUDA device, the count is 0 (asked in a child
process). What the device does that is not CUDA's runs on a CPU too
(``tests/unit/test_cupy_ops.py``; its refusals where no GPU is: ``test_cupy_device.py``)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from test_differential import EXAMPLES, chains, check, check_graph
import test_graphs as graphs  # (its cases, not collected again here)
from test_updates import PROGRAMS, READS, run

import fabric
from fabric import LocalCluster

# How many GPUs CuPy finds, asked in a child process (nothing printed: CuPy missing, or no
# device), so that this one holds no CUDA context the workers need.
_PROBE = ("import cupy\ntry: print(cupy.cuda.runtime.getDeviceCount())\n"
          "except cupy.cuda.runtime.CUDARuntimeError: print(0)")
GPUS = int(subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=120).stdout.strip() or 0)
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no GPU that CuPy can use on this machine")
MEMORY_LIMIT = 4 << 30


@pytest.fixture(scope="module")
def gpu_cluster():
    """A broker and one cupy worker hosting every GPU, each held to ``MEMORY_LIMIT``."""
    with LocalCluster(workers=1, backend="cupy", devices_per_worker=GPUS,
                      worker_args=("--memory-limit", str(MEMORY_LIMIT))) as running:
        yield running


@pytest.fixture
def cupy_session(gpu_cluster):
    """A fresh session on GPU 0."""
    with gpu_cluster.connect() as opened:
        yield opened


def test_every_gpu_is_a_device_and_large_arrays_cross_through_the_pinned_buffers(gpu_cluster):
    for index in range(GPUS):
        with gpu_cluster.connect(device=index) as session:
            settings = session.device.settings
            assert settings["backend"] == "cupy" and settings["memory_bytes"] > 0
            data = np.random.default_rng(index).random((3000, 3000))  # 72 MB: 9 buffers' worth
            x = session.asarray(data)
            np.testing.assert_array_equal(x.numpy(), data)
            np.testing.assert_allclose((x @ x).numpy(), data @ data, rtol=1e-12)
            assert session.stats()["device_staging_bytes"] == settings["staging_bytes"]


def test_an_op_past_the_memory_limit_is_refused_and_the_device_goes_on(cupy_session):
    small = cupy_session.ones(1000)
    with pytest.raises(fabric.QuotaExceeded, match="--memory-limit"):
        cupy_session.ones(MEMORY_LIMIT // 8 + 1).numpy()
    assert (small * 2).sum().numpy() == 2000


def test_a_graphs_elementwise_chain_runs_as_one_fused_kernel(cupy_session):
    @fabric.function
    def step(x):
        for _ in range(10):
            x = np.tanh(x) * 0.5 + x
        return x
    data = np.linspace(-1, 1, 1 << 20)
    x = cupy_session.asarray(data)
    expected = data
    for _ in range(10):
        expected = np.tanh(expected) * 0.5 + expected
    for _ in range(3):
        np.testing.assert_allclose(step(x).numpy(), expected, rtol=1e-12)
    assert cupy_session.stats()["ops_fused"] >= 2 * 30


@pytest.mark.parametrize("case", [
    graphs.test_one_registration_then_replays_of_one_small_op_each,
    graphs.test_results_keep_the_functions_structure_and_constants,
    graphs.test_a_new_signature_traces_again_and_a_known_one_does_not,
    graphs.test_random_ops_and_creation_inside_a_graph_use_the_session,
    graphs.test_a_traced_function_called_from_another_is_inlined,
    graphs.test_an_op_failing_inside_a_graph_names_the_graph_and_the_line,
    graphs.test_an_unknown_graph_and_wrong_bindings_give_typed_errors,
], ids=lambda case: case.__name__.removeprefix("test_"))
def test_graphs_on_a_gpu(cupy_session, case):
    case(cupy_session)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_updates_on_a_gpu(cupy_session, name):
    run(PROGRAMS[name], cupy_session)


@pytest.mark.parametrize("name", list(READS))
def test_reads_on_a_gpu(cupy_session, name):
    run(READS[name], cupy_session)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run_chain", [check, check_graph], ids=["streamed", "as a graph"])
@EXAMPLES
@given(chain=chains())
def test_random_chains_agree_with_numpy_on_a_gpu(cupy_session, run_chain, chain):
    run_chain(cupy_session, chain)
