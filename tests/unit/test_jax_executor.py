"""The jax device behind an executor, in this process (sans I/O): arrays on the XLA device,
numpy's dtypes or a refusal, memory counted by ``nbytes``, and a registered graph compiled
once (one XLA executable per signature) and replayed."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_executor import opened, read, request, submit

from fabric.core.errors import DtypeNotSupported
from fabric.core.ops import OPS
from fabric.workers.backends import device_class
from fabric.workers.backends.jax_backend import JaxDevice

F8 = {"dtype": "<f8", "shape": [2, 3], "buffer": 0}
DATA = np.arange(6.0).reshape(2, 3) * 0.75 - 1


def _graph(graph_id: int, shape: list[int]) -> list:
    """A graph of elementwise ops and a reduction on one float64 input of ``shape``."""
    return ["graph_register", 0, [], {
        "graph": graph_id, "name": "step", "inputs": [[shape, "<f8"]],
        "ops": [["tanh", 2, [1], {}], ["multiply", 3, [2, 0.5], {}], ["add", 4, [3, 1], {}],
                ["sum", 5, [4], {"axis": None}]],
        "outputs": [4, 5]}]


def test_arrays_live_on_the_xla_device_and_come_back_through_host_memory():
    device = device_class("jax")(0)
    executor = opened(device=device)
    submit(executor, ["put", 1, [], F8], ["multiply", 2, [1, [3]], {}],
           buffers=(DATA.tobytes(),))
    held = executor.sessions[next(iter(executor.sessions))].tensors
    assert isinstance(held[2], jax.Array) and held[2].devices() == {device.xla}
    np.testing.assert_array_equal(read(executor, 2), DATA * 3)
    # counted by nbytes, as a host array is
    assert request(executor, op="stats").body["resident_bytes"] == 2 * DATA.nbytes


@pytest.mark.parametrize("name, args, params", [
    ("divide", [np.arange(3, dtype=np.int8), 2], {}),  # numpy: float64
    ("sqrt", [np.array([1, 4], np.int8)], {}),  # numpy's loop: float16
    ("add", [np.arange(3), np.ones(3, np.float32)], {}),  # int64 + float32: float64 (jax: f32)
    ("floor_divide", [np.array([5, -5, 3]), np.array([0, 2, -2])], {}),  # by 0: 0
    ("mean", [np.array([True, False])], {"axis": None}),
    ("cumsum", [np.arange(3, dtype=np.int32)], {"axis": None}),
    ("astype", [np.array([np.nan, np.inf, 3e9, -2.5])], {"dtype": "int32"}),
    ("sign", [np.array([-0.0, np.nan, -2.0])], {}),
])
def test_an_op_gives_numpys_dtype_and_values(name, args, params):
    device = device_class("jax")(0)
    inputs = [device.from_host(a) if isinstance(a, np.ndarray) else a for a in args]
    got = device.to_host(device.run(OPS[name], inputs, params))
    with np.errstate(all="ignore"):
        expected = np.asarray(OPS[name].impl(*args, **params))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_a_dtype_xla_cannot_hold_is_refused_never_computed_in_another_precision():
    device = device_class("jax")(0)
    with pytest.raises(DtypeNotSupported, match="cannot hold float128"):
        device.from_host(np.ones(2, np.longdouble))
    with pytest.raises(DtypeNotSupported, match="cannot hold float128"):
        device.run(OPS["astype"], [device.from_host(np.ones(2))], {"dtype": "float128"})


def test_a_graph_compiles_once_per_signature_and_replays():
    device: JaxDevice = device_class("jax")(0)
    executor = opened(device=device)
    submit(executor, ["put", 1, [], F8], _graph(7, [2, 3]),
           ["graph_call", 10, [1], {"graph": 7, "outputs": 2}],
           ["graph_call", 12, [1], {"graph": 7, "outputs": 2}],
           buffers=(DATA.tobytes(),))
    expected = np.tanh(DATA) * 0.5 + DATA
    for out in (10, 12):
        np.testing.assert_allclose(read(executor, out), expected, rtol=1e-15)
        np.testing.assert_allclose(read(executor, out + 1), expected.sum(), rtol=1e-14)
    assert device.compiles == 1 and device.compile_seconds > 0
    # another signature is another registration: one more executable
    submit(executor, ["put", 20, [], {"dtype": "<f8", "shape": [4], "buffer": 0}],
           _graph(8, [4]), ["graph_call", 21, [20], {"graph": 8, "outputs": 2}],
           buffers=(np.ones(4).tobytes(),))
    np.testing.assert_allclose(read(executor, 21), np.tanh(1.0) * 0.5 + 1)
    assert device.compiles == 2
    assert request(executor, op="stats").body["graph_replays"] == 1


def test_a_graph_that_reads_its_data_runs_op_by_op_with_numpys_errors():
    device: JaxDevice = device_class("jax")(0)
    executor = opened(device=device)
    submit(executor, ["put", 1, [], {"dtype": "<i8", "shape": [3], "buffer": 0}],
           ["graph_register", 0, [], {
               "graph": 3, "name": "powers", "inputs": [[[3], "<i8"]],
               "ops": [["power", 2, [1, 1], {}]], "outputs": [2]}],
           ["graph_call", 5, [1], {"graph": 3, "outputs": 1}],
           buffers=(np.array([2, -1, 3]).tobytes(),))
    reply = request(executor, op="read", id=5)
    assert "negative integer powers" in reply.body["error"]["message"]
    assert device.compiles == 0


# The most units in the last place by which XLA's functions (CPU) differ from numpy's, as
# measured on 200,000 points of each one's domain (float64, float32); the differential
# test's tolerances (1e-12 and 2e-5 relative: about 4,500 and 170 ulp) hold them all, so the
# jax device is compared with numpy's own tolerances.
XLA_ULPS = {"exp": (2, 2), "expm1": (3, 4), "exp2": (12, 9), "log": (1, 3), "log1p": (2, 3),
            "log10": (2, 3), "sin": (1, 1), "cos": (1, 1), "tan": (1, 1), "arcsin": (2, 3),
            "arctan": (1, 1), "sinh": (16, 9), "cosh": (16, 10), "tanh": (7, 4),
            "arcsinh": (2, 3), "arctanh": (129, 3), "cbrt": (3, 2), "sqrt": (0, 0)}
DOMAINS = {"log": (1e-3, 50), "log1p": (1e-3, 50), "log10": (1e-3, 50), "sqrt": (0, 50),
           "arcsin": (-1, 1), "arctanh": (-1, 1), "tan": (-1, 1)}


@pytest.mark.parametrize("name", sorted(XLA_ULPS))
def test_xlas_transcendental_functions_differ_from_numpys_in_the_last_bits_only(name):
    device = device_class("jax")(0)
    for dtype, bound in zip((np.float64, np.float32), XLA_ULPS[name]):
        x = np.random.default_rng(0).uniform(*DOMAINS.get(name, (-20, 20)), 20_000)
        x = x.astype(dtype)
        got = device.to_host(device.run(OPS[name], [device.from_host(x)], {}))
        expected = getattr(np, name)(x)
        finite = np.isfinite(expected)
        ulps = np.abs(got[finite].astype(np.float64) - expected[finite]) / np.spacing(
            np.abs(expected[finite])).astype(np.float64)
        assert ulps.max() <= bound, (name, dtype)


def _chain(x: int, first: int, rounds: int = 4) -> tuple[list, int]:
    """A batch of ``rounds`` rounds of y = y * 2 + 0.5 on tensor ``x``, its intermediates
    freed as a client frees them, new ids from ``first``; and the id of its result."""
    ops: list = []
    for i in range(rounds):
        product, total = first + 2 * i, first + 2 * i + 1
        ops += [[product, "multiply", x, [2]], [total, "add", product, 0.5], product]
        if x != 1:
            ops.append(x)
        x = total
    return ops, x


def test_a_batch_seen_again_runs_as_one_compiled_graph_whatever_its_ids():
    device: JaxDevice = device_class("jax")(0)
    executor = opened(device=device)
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [5], "buffer": 0}],
           buffers=(np.arange(5.0).tobytes(),))
    x, expected = 1, np.arange(5.0)
    for first in (100, 200, 300, 400):  # the same batch each time, with new ids
        ops, x = _chain(x, first)
        submit(executor, *ops)
        for _ in range(4):
            expected = expected * 2 + 0.5
        np.testing.assert_array_equal(read(executor, x), expected)
    # seen once (op by op), again (registered, compiled, run), then replayed
    assert (device.compiles, executor.batches.registered, executor.batches.replays) == (1, 1, 3)
    # what the batch left alive is held under the client's ids, its intermediates freed
    stats = request(executor, op="stats").body
    assert stats["tensors"] == 2 and stats["resident_bytes"] == 2 * 5 * 8
    assert stats["ops"] == 1 + 4 * 8


def test_a_batch_that_cannot_be_a_graph_runs_op_by_op():
    device: JaxDevice = device_class("jax")(0)
    executor = opened(device=device)
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [5], "buffer": 0}],
           buffers=(np.arange(5.0).tobytes(),))
    for first in (100, 200, 300):  # (a random draw: never in a batch's graph)
        draw = ["uniform", first + 99, [], {"shape": [2], "low": 0.0, "high": 1.0,
                                            "dtype": "float64"}]
        submit(executor, draw, *_chain(1, first)[0])
    assert executor.batches.registered == 0
    # a batch reading a poisoned tensor: op by op, the poison flows as it always does
    submit(executor, ["sum", 50, [1], {"axis": 3}])  # (no axis 3: poisoned)
    for first in (500, 600, 700):
        submit(executor, [first, "multiply", 50, [2]], [first + 1, "add", first, 0.5],
               [first + 2, "multiply", first + 1, [2]], [first + 3, "add", first + 2, 0.5])
        assert request(executor, op="read", id=first + 3).body["error"]["details"]["op"] \
            == "sum"
    assert executor.batches.registered == 0


def test_a_batch_past_the_memory_limit_is_refused_op_by_op_naming_the_op():
    device: JaxDevice = device_class("jax")(0)
    executor = opened(device=device, memory_limit=2000)
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [50], "buffer": 0}],
           buffers=(np.arange(50.0).tobytes(),))
    for first in (100, 200):  # four 400-byte tensors kept: seen, then compiled and run
        submit(executor, *[[first + i, "multiply", 1, [2]] for i in range(4)])
        submit(executor, *[first + i for i in range(4)])
    assert executor.batches.registered == 1
    submit(executor, ["put", 2, [], {"dtype": "<f8", "shape": [50], "buffer": 0}],
           buffers=(np.arange(50.0).tobytes(),))  # now the batch does not fit
    submit(executor, *[[300 + i, "multiply", 1, [2]] for i in range(4)])
    error = request(executor, op="read", id=303).body["error"]
    assert error["code"] == "quota_exceeded" and error["details"]["op"] == "multiply"
    np.testing.assert_array_equal(read(executor, 302), np.arange(50.0) * 2)
    assert executor.batches.replays == 1
