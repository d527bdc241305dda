"""The cupy device's code that is not CUDA's, run on this CPU with numpy standing in for
CuPy (the same functions the device calls with ``cupy``): the ops it spells otherwise, its
graphs' elementwise runs (the fused function numpy's dtypes and values, cut where a value is
read outside, falling back op by op where a kernel fails or gives another dtype) and its
transfers' staging through reused buffers, whose copies complete only when waited for, as a
GPU's. Not tested here: ``cupy.fuse``'s kernels, CuPy's ops, pinned memory and streams (on a
GPU: ``tests/cluster/test_cupy_gpu.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from fabric.core.op_indexing import IndexArray
from fabric.core.ops import OPS, Spec
from fabric.workers.backends.base import Constant, GraphOp, GraphOpError
from fabric.workers.backends.cupy_ops import fusable_ops, fused_steps, spelled
from fabric.workers.backends.index_checks import repeats_a_position
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.backends.staging import StagingBuffers
from value_edges import OP_CASES

pytestmark = pytest.mark.timeout(60)


def _graph(inputs: dict[int, np.ndarray], lines: list[tuple[str, int, list]]):
    """GraphOps of ``lines`` (name, out, args: local ids, or scalars) on ``inputs``, each
    spec inferred by the op table as the client infers it, and numpy's own values."""
    specs = {i: Spec(a.shape, a.dtype) for i, a in inputs.items()}
    values = dict(inputs)
    ops = []
    for index, (name, out, args) in enumerate(lines):
        shape, dtype = OPS[name].infer([specs[a] if type(a) is int else a for a in args], {})
        specs[out] = Spec(shape, np.dtype(dtype))
        ops.append(GraphOp(index, name, out, [a if type(a) is int else Constant(a)
                                              for a in args], {}, specs[out]))
        with np.errstate(all="ignore"):
            values[out] = np.asarray(OPS[name].impl(*[values[a] if type(a) is int else a
                                                      for a in args]))
    return ops, specs, values


def _run(steps, inputs):
    held = dict(inputs)
    for step in steps:
        with np.errstate(all="ignore"):
            held[step.out] = np.asarray(step.call(*[a.value if type(a) is Constant else held[a]
                                                    for a in step.args]))
    return held


INPUTS = {0: np.array([1.5, -2.0, np.nan, 0.0]), 1: np.array([3, 0, -1, 2], np.int32),
          2: np.array([True, False, True, True])}
# A chain of elementwise ops (Python and numpy scalars, an int32 with a float, a bool made a
# number), with a reduction in its middle and a value read after it
LINES = [("multiply", 3, [1, 0.5]), ("add", 4, [3, 0]), ("tanh", 5, [4]),
         ("multiply", 6, [5, 2]), ("subtract", 7, [6, np.float32(1.5)]),
         ("sum", 8, [7]), ("greater", 9, [4, 1]), ("logical_and", 10, [9, 2]),
         ("add", 11, [10, 3]), ("power", 12, [1, 2])]


def test_a_graphs_elementwise_runs_are_fused_with_numpys_dtypes_and_values():
    ops, specs, expected = _graph(INPUTS, LINES)
    kernels, fused = [], []

    def fuse(chain):  # (numpy's calls, as compiled: the very function cupy.fuse is given)
        kernels.append(chain)
        return chain
    steps = fused_steps(ops, specs, [11, 8, 12], np, fuse, NumpyDevice(0).bind, fused.append)
    # 3 and 4 are read past the run (by add and greater): a step each; tanh..subtract is
    # one; sum runs alone; greater..add is one (11 an output), power a step of its own
    assert [step.ops for step in steps] == [(0,), (1,), (2, 3, 4), (5,), (6, 7, 8), (9,)]
    assert len(kernels) == 2
    held = _run(steps, INPUTS)
    for out in (4, 7, 8, 11, 12):
        assert held[out].dtype == expected[out].dtype, out
        np.testing.assert_array_equal(held[out], expected[out])
    assert fused == [3, 3]


def test_a_fused_call_that_fails_or_gives_another_dtype_runs_its_ops_one_by_one():
    ops, specs, expected = _graph(INPUTS, LINES[:5])
    for broken in (lambda chain: lambda *values: chain(*values).astype(np.float32),
                   lambda chain: lambda *values: 1 / 0):
        fused = []
        steps = fused_steps(ops, specs, [7], np, broken, NumpyDevice(0).bind, fused.append)
        for _ in range(2):  # (the second call: one by one at once)
            held = _run(steps, INPUTS)
            assert held[7].dtype == expected[7].dtype
            np.testing.assert_array_equal(held[7], expected[7])
        assert fused == []


def test_an_op_that_fails_in_a_run_is_named():
    ops, specs, _ = _graph({0: np.ones(3)}, [("add", 1, [0, 1.0]), ("sqrt", 2, [1])])
    steps = fused_steps(ops, specs, [2], np, lambda chain: None, NumpyDevice(0).bind,
                        lambda n: None)  # (no kernel: one by one)

    def failing_sqrt(x):
        raise FloatingPointError("invalid value")
    steps[0].call.one_by_one[1] = steps[0].call.one_by_one[1]._replace(call=failing_sqrt)
    with pytest.raises(GraphOpError) as raised:
        _run(steps, {0: np.ones(3)})
    assert raised.value.index == 1


def test_the_fusable_ops_are_the_tables_ufuncs_of_one_output():
    names = fusable_ops(np)
    assert {"add", "tanh", "logical_and", "power", "greater"} <= names
    assert not names & {"divmod", "frexp", "sum", "where", "astype", "matmul"}


def test_the_ops_cupy_lacks_are_numpys():
    ops = spelled(np, np.asarray)
    a = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, np.nan]])
    np.testing.assert_array_equal(ops["nanquantile"](a, q=0.5, axis=1),
                                  np.nanquantile(a, 0.5, axis=1))
    np.testing.assert_array_equal(ops["nanpercentile"](a, q=[10, 90]),
                                  np.nanpercentile(a, [10, 90]))
    m, b = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([1.0, 2.0, 0.0])
    np.testing.assert_allclose(ops["lstsq_residuals"](m, b), np.linalg.lstsq(m, b)[1])


class _Stream:
    """A GPU stream, standing in: a copy started runs when it, or one started after it, is
    waited for (an event's wait), in the order they were started."""

    def __init__(self) -> None:
        self.queued: list = []

    def start(self, copy):
        self.queued.append(copy)
        position = len(self.queued)

        def wait():
            while position > 0 and any(self.queued[:position]):
                for i, queued in enumerate(self.queued[:position]):
                    if queued is not None:
                        self.queued[i] = None
                        queued()
        return wait


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 9, 40, 1001])
def test_staging_copies_any_length_through_reused_buffers_waiting_before_each_reuse(nbytes):
    made = []
    staging = StagingBuffers(lambda size: made.append(size) or np.empty(size, np.uint8),
                             size=8, count=2)
    source = np.random.default_rng(nbytes).integers(0, 256, nbytes).astype(np.uint8)
    device, stream = np.zeros(nbytes, np.uint8), _Stream()  # (the GPU's memory, standing in)

    def write(part, buffer):  # (a buffer rewritten before its copy ran: corrupt data)
        return stream.start(lambda: device.__setitem__(part, buffer.copy()))

    def read(part, buffer):
        return stream.start(lambda: buffer.__setitem__(slice(None), device[part]))
    staging.upload(source, write)
    back = np.zeros(nbytes, np.uint8)
    staging.download(back, read)
    np.testing.assert_array_equal(device, source)
    np.testing.assert_array_equal(back, source)
    assert made == [8] * len(made) and len(made) <= 2  # (at most two buffers, ever)
    assert staging.held_bytes() == 8 * len(made)


def test_an_index_is_checked_as_numpy_checks_it_and_an_update_is_copy_on_write():
    ops, first = spelled(np, np.asarray), IndexArray(0)  # (the op's first index array)
    target = np.arange(6.0).reshape(2, 3)
    with pytest.raises(IndexError, match="out of bounds"):  # (CuPy would wrap it around)
        ops["getitem"](target, np.array([0, 3]), index=(slice(None), first))
    np.testing.assert_array_equal(ops["getitem"](target, np.array([-1, 0]), index=(first,)),
                                  target[[-1, 0]])
    with pytest.raises(IndexError, match="out of bounds"):
        ops["setitem"](target, 1.0, np.array([5]), index=(first,))
    updated = ops["setitem"](target, np.full((1, 1, 3), 7.0), index=(0,))  # (leading ones)
    expected = target.copy()
    expected[0] = np.full((1, 1, 3), 7.0)
    np.testing.assert_array_equal(updated, expected)
    assert target[0, 0] == 0.0  # (the old value kept)
    counted = ops["ufunc_at"](np.zeros(3), 1.0, np.array([0, 0, 2]), ufunc="add",
                              index=(first,))
    np.testing.assert_array_equal(counted, [2.0, 0.0, 1.0])


class _CupyKernels:
    """numpy with CuPy's kernels where they compute otherwise (CuPy's ``_routines_math.pyx``
    and ``carray.cuh``): a float's ``floor_divide`` is ``floor(a / b)`` and its
    ``remainder`` ``a - floor(a / b) * b``, an integer's ``fmod`` is computed in double, an
    integer to a negative power 0, 1 or -1,
    ``bincount`` counts what it is given and ``searchsorted`` takes arrays alone; whatever
    reaches them shows in the values."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def floor_divide(a, b):
        return np.floor(a / b) if a.dtype.kind == "f" else np.floor_divide(a, b)

    @staticmethod
    def remainder(a, b):
        return a - np.floor(a / b) * b if a.dtype.kind == "f" else np.remainder(a, b)

    @staticmethod
    def fmod(a, b):  # (an integer's through double)
        if a.dtype.kind not in "iu":
            return np.fmod(a, b)
        through = np.fmod(a.astype(np.float64), b.astype(np.float64))
        return np.where(b == 0, 0, np.nan_to_num(through)).astype(a.dtype)

    @staticmethod
    def power(a, b):
        if a.dtype.kind != "i":
            return np.power(a, b)
        wrapped = np.where(a == -1, np.where(b % 2 == 1, -1, 1), np.where(a == 1, 1, 0))
        return np.where(b < 0, wrapped, np.power(a, np.maximum(b, 0))).astype(a.dtype)

    @staticmethod
    def searchsorted(a, v, side="left", sorter=None):
        if not isinstance(v, np.ndarray):
            raise NotImplementedError("Only int or ndarray are supported for v")
        return np.searchsorted(a, v, side=side, sorter=sorter)

    @staticmethod
    def bincount(x, *weights, minlength=0):
        return np.bincount(np.maximum(x, 0), *weights, minlength=minlength)


@pytest.mark.parametrize("name, args, params", OP_CASES)
def test_values_cupy_computes_otherwise_are_numpys(name, args, params):
    """The cupy device's functions on CuPy's kernels (numpy standing in) give numpy's values
    and errors. (A float converted to an integer: only values in range reach the module's
    cast, which is the one thing that a saturating cast would show; the jax device, whose
    XLA saturates as CUDA does, runs the same lines on the same values.)"""
    ops = spelled(_CupyKernels(), np.asarray)
    with np.errstate(all="ignore"):
        try:
            expected = np.asarray(OPS[name].impl(*args, **params))
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                ops[name](*args, **params)
            return
        got = ops[name](*args, **params)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    assert (np.signbit(got) == np.signbit(expected)).all()  # (a float's signed zeros)


def test_searchsorted_takes_a_scalar_as_numpys():
    ops, a = spelled(_CupyKernels(), np.asarray), np.array([1.0, 2.0, np.nan])
    for v in (2.0, np.nan, np.array([np.nan, 2.0, -np.inf])):
        for side in ("left", "right"):
            np.testing.assert_array_equal(ops["searchsorted"](a, v, side=side),
                                          np.searchsorted(a, v, side=side))
    np.testing.assert_array_equal(ops["searchsorted"](a[::-1], 1.5, np.array([1, 2, 0])),
                                  np.searchsorted(a[::-1], 1.5, sorter=[1, 2, 0]))


def test_the_ops_cupy_computes_otherwise_are_not_fused():
    """A float's floor_divide and remainder, an integer's power and fmod run as their own
    steps (the device's functions), beside fused neighbours."""
    inputs = {0: np.array([1.0, -1.0, 5.0]), 1: np.array([2, 3, -1])}
    ops, specs, expected = _graph(inputs, [
        ("add", 2, [0, 1.0]), ("floor_divide", 3, [2, 0.1]), ("multiply", 4, [3, 2.0]),
        ("add", 5, [4, 1.0]), ("power", 6, [1, np.int64(2)]), ("negative", 7, [6]),
        ("absolute", 8, [7]), ("remainder", 9, [5, np.inf]), ("fmod", 10, [8, np.int64(3)]),
        ("negative", 11, [10])])
    steps = fused_steps(ops, specs, [9, 11], np, lambda chain: chain, NumpyDevice(0).bind,
                        lambda n: None)
    assert [step.ops for step in steps] == [(0,), (1,), (2, 3), (4,), (5, 6), (7,), (8,),
                                            (9,)]


_ALL = slice(None)
_MASK = np.ones((3, 4), bool)


@pytest.mark.parametrize("key", [
    (np.array([0, 2, -3]),), (np.array([0, 2, -1]),), (_ALL, np.array([1, 1])),
    (Ellipsis, np.array([4, -1])), (np.array([0, 1]), _ALL, np.array([2, 2])),
    (np.array([0, 0]), _ALL, np.array([2, 3])), (None, np.array([[0], [0]]), np.array([1, 2])),
    (np.array([1]), Ellipsis), (_MASK, np.resize(np.arange(5), 12)),
    (_MASK, np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 0])), (0, np.array([3, -1])),
    (0, np.array([3, -2]), slice(1, 3)), (np.array([True, False, True]), np.array([1, 1])),
    (np.array([True, False, True]),), (_ALL, _ALL, np.array([], int)),
    (np.array([[0, 1], [1, 0]]), np.array([[2], [2]])),
    (np.array([[0, 1], [1, 0]]), np.array([[2, 3]])), (np.array(True), np.array([1, 1])),
    (np.array(False), np.array([[0], [0]]))], ids=str)
def test_an_index_repeating_a_position_is_told_as_numpy_selects(key):
    shape = (3, 4, 5)
    positions = np.arange(60).reshape(shape)[key]
    assert repeats_a_position(shape, key) == (np.unique(positions).size < positions.size)


def test_an_update_repeating_a_position_stores_the_last_value_as_numpys():
    """CuPy stores any one of the values given for a position: the device runs numpy's own
    update on a host copy, in numpy's casting too."""
    ops, first = spelled(_CupyKernels(), np.asarray), IndexArray(0)
    target, rows = np.zeros((2, 3), np.int32), np.arange(10000) % 2
    for value in (np.arange(30000.0).reshape(10000, 3) - 0.5, np.float64(np.nan), 7):
        expected = target.copy()
        with np.errstate(all="ignore"):
            expected[rows] = value
            got = ops["setitem"](target, value, rows, index=(first,))
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    assert not target.any()  # (the old value kept)
