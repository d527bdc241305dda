"""The cupy device on NVIDIA GPUs: the tensor, update and graph suites and the differential
test run on it, its memory pool held to --memory-limit, its transfers through the pinned
buffers, its elementwise graphs fused. These tests skip on the GPU count, never on an
import: where CuPy is missing, or finds no CUDA device, the count is 0 (asked in a child
process). What the device does that is not CUDA's runs on a CPU too
(``tests/unit/test_cupy_ops.py``; its refusals where no GPU is: ``test_cupy_device.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gpu_cluster, gpu_count
from hypothesis import given
from test_differential import EXAMPLES, chains, check, check_graph
import test_graphs as graphs  # (its cases, not collected again here)
from test_updates import PROGRAMS, READS, run
from value_edges import CASES, check_on

import fabric

GPUS = gpu_count("cupy")
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no GPU that CuPy can use on this machine")
MEMORY_LIMIT = 4 << 30


@pytest.fixture(scope="module")
def gpus():
    """A broker and one cupy worker hosting every GPU, each held to ``MEMORY_LIMIT``."""
    with gpu_cluster("cupy", "--memory-limit", str(MEMORY_LIMIT)) as running:
        yield running


def test_every_gpu_is_a_device_and_large_arrays_cross_through_the_pinned_buffers(gpus):
    for index in range(GPUS):
        with gpus.connect(device=index) as session:
            settings = session.device.settings
            assert settings["backend"] == "cupy" and settings["memory_bytes"] > 0
            data = np.random.default_rng(index).random((3000, 3000))  # 72 MB: 9 buffers' worth
            x = session.asarray(data)
            np.testing.assert_array_equal(x.numpy(), data)
            np.testing.assert_allclose((x @ x).numpy(), data @ data, rtol=1e-12)
            assert session.stats()["device_staging_bytes"] == settings["staging_bytes"]


def test_an_op_past_the_memory_limit_is_refused_and_the_device_goes_on(gpu_session):
    small = gpu_session.ones(1000)
    with pytest.raises(fabric.QuotaExceeded, match="--memory-limit"):
        gpu_session.ones(MEMORY_LIMIT // 8 + 1).numpy()
    assert (small * 2).sum().numpy() == 2000


def test_a_graphs_elementwise_chain_runs_as_one_fused_kernel(gpu_session):
    @fabric.function
    def step(x):
        for _ in range(10):
            x = np.tanh(x) * 0.5 + x
        return x
    data = np.linspace(-1, 1, 1 << 20)
    x = gpu_session.asarray(data)
    expected = data
    for _ in range(10):
        expected = np.tanh(expected) * 0.5 + expected
    for _ in range(3):
        np.testing.assert_allclose(step(x).numpy(), expected, rtol=1e-12)
    assert gpu_session.stats()["ops_fused"] >= 2 * 30


@pytest.mark.parametrize("case", [
    graphs.test_one_registration_then_replays_of_one_small_op_each,
    graphs.test_results_keep_the_functions_structure_and_constants,
    graphs.test_a_new_signature_traces_again_and_a_known_one_does_not,
    graphs.test_random_ops_and_creation_inside_a_graph_use_the_session,
    graphs.test_a_traced_function_called_from_another_is_inlined,
    graphs.test_an_op_failing_inside_a_graph_names_the_graph_and_the_line,
    graphs.test_an_unknown_graph_and_wrong_bindings_give_typed_errors,
], ids=lambda case: case.__name__.removeprefix("test_"))
def test_graphs_on_a_gpu(gpu_session, case):
    case(gpu_session)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_updates_on_a_gpu(gpu_session, name):
    run(PROGRAMS[name], gpu_session)


@pytest.mark.parametrize("name", list(READS))
def test_reads_on_a_gpu(gpu_session, name):
    run(READS[name], gpu_session)


@pytest.mark.parametrize("name, args, params", CASES)
def test_values_cupy_computes_otherwise_are_numpys_on_a_gpu(gpu_session, name, args, params):
    """CuPy's own kernels behind the device's checks and spellings (on a CPU, numpy stands
    in for them: tests/unit/test_cupy_ops.py)."""
    check_on(gpu_session, name, args, params)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run_chain", [check, check_graph], ids=["streamed", "as a graph"])
@EXAMPLES
@given(chain=chains())
def test_random_chains_agree_with_numpy_on_a_gpu(gpu_session, run_chain, chain):
    run_chain(gpu_session, chain)
