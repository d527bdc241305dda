"""A device elides large temporaries as numpy does (``workers.elision``): sans I/O on an
executor, where the arrays' addresses show which op wrote where, then end to end."""

from __future__ import annotations

import numpy as np
import pytest
from test_executor import SESSION, opened, read, submit

ROWS = 512  # (ROWS, 64) float64: 256 KiB, numpy's threshold


def address(executor, tensor_id: int) -> int:
    return executor.sessions[SESSION].tensors[tensor_id].__array_interface__["data"][0]


def temporary(executor, dtype: str = "<f8", rows: int = ROWS, columns: int = 64) -> np.ndarray:
    """Tensor 1 uploaded and tensor 2 = tensor 1 + 1 (a temporary the device made)."""
    data = np.arange(rows * columns).reshape(rows, columns).astype(dtype)
    submit(executor, ["put", 1, [], {"dtype": dtype, "shape": [rows, columns], "buffer": 0}],
           ["add", 2, [1, 1.0], {}], buffers=(data.tobytes(),))
    return data + 1.0


def test_a_large_temporary_freed_right_after_its_use_takes_the_result():
    executor = opened()
    expected = temporary(executor)
    data = expected - 1.0  # (tensor 1)
    before = address(executor, 2)
    submit(executor, ["multiply", 3, [2, 2.0], {}], 2, ["subtract", 4, [3, 1], {}], 3,
           ["getitem", 5, [1], {"index": [[0, 1, None]]}],  # a row, broadcast below
           ["add", 6, [5, 4], {}], 4, 5)
    assert address(executor, 6) == before  # the three ops wrote into tensor 2's memory
    np.testing.assert_array_equal(read(executor, 6), data[0:1] + expected * 2.0 - data)


@pytest.mark.parametrize("case", ["a view of it", "freed later", "a bool result",
                                  "a wider input", "a larger result", "a matmul", "small"])
def test_a_temporary_that_another_tensor_sees_or_that_cannot_hold_the_result_is_kept(case):
    executor = opened()
    expected = temporary(executor, rows=ROWS // 2 if case == "small" else ROWS,
                         columns=ROWS if case == "a matmul" else 64)  # (square: they broadcast)
    data = expected - 1.0  # (tensor 1)
    before = address(executor, 2)
    ops, result = {  # (a bare int among the args is a tensor id: 5 is made first)
        "a view of it": ([["getitem", 5, [2], {"index": [0]}], ["multiply", 3, [2, 2.0], {}],
                          2], expected * 2.0),
        "freed later": ([["multiply", 3, [2, 2.0], {}], ["add", 5, [1, 1.0], {}], 2],
                        expected * 2.0),
        "a bool result": ([["greater", 3, [2, 2.0], {}], 2], expected > 2.0),
        "a wider input": ([["astype", 5, [1], {"dtype": "<c16"}], ["multiply", 3, [2, 5], {}],
                           2], expected * data.astype(np.complex128)),
        "a larger result": ([["getitem", 5, [1], {"index": [None]}],
                             ["multiply", 3, [2, 5], {}], 2], expected * data[None]),
        "a matmul": ([["matmul", 3, [2, 1], {}], 2], expected @ data if case == "a matmul"
                     else None),
        "small": ([["multiply", 3, [2, 2.0], {}], 2], expected * 2.0),
    }[case]
    submit(executor, *ops)
    assert address(executor, 3) != before
    got = read(executor, 3)
    assert got.dtype == result.dtype
    np.testing.assert_array_equal(got, result)
    if case == "a view of it":
        np.testing.assert_array_equal(read(executor, 5), expected[0])  # untouched


def test_elided_chains_give_numpys_values_end_to_end(session):
    x = np.random.default_rng(3).normal(size=(ROWS, 128))
    t = session.asarray(x)
    step = t[1:-1] + 0.2 * (t[2:] + t[:-2] - 2 * t[1:-1])  # heat's stencil, along axis 0
    kept = (t * 2.0 + 1.0)
    view = kept[3]
    chained = ((kept - 1.0) * 0.5 - t) ** 2 + np.abs(t)  # (kept is read again below)
    np.testing.assert_allclose(step.numpy(), x[1:-1] + 0.2 * (x[2:] + x[:-2] - 2 * x[1:-1]),
                               rtol=0, atol=0)
    np.testing.assert_array_equal(chained.numpy(), ((x * 2.0 + 1.0 - 1.0) * 0.5 - x) ** 2
                                  + np.abs(x))
    np.testing.assert_array_equal(view.numpy(), (x * 2.0 + 1.0)[3])
    np.testing.assert_array_equal(kept.numpy(), x * 2.0 + 1.0)
