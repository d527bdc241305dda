"""End-to-end parity with numpy for updates, mask and fancy reads, data-dependent shapes and
printing, on real numpy and numexpr devices.

Each case is a small program run twice: on a numpy array (with numpy arrays as indices) and
on a tensor uploaded from it (with the same indices as tensors where the case says ``up``).
The arrays it returns (the updated one, views of it, other names) must read back as numpy's;
where numpy raises, fabric must raise the same exception type at the call.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import HEARTBEAT

import fabric
from fabric import LocalCluster, Tensor
from fabric.core.errors import MessageTooLarge, QuotaExceeded, RemoteError, TraceError
from fabric.core.worker_options import NUMEXPR_MIN_SIZE_ENV

BASE = np.arange(-6.0, 14.0).reshape(4, 5)
MASK = BASE % 3 == 0
ROWS = np.array([0, 2, 2])

UPDATES = {
    # basic indexes
    "t[0] = 5": lambda a, up: a.__setitem__(0, 5),
    "t[-1, 2] = 7": lambda a, up: a.__setitem__((-1, 2), 7),
    "t[1:3, ::2] = -1": lambda a, up: a.__setitem__((slice(1, 3), slice(None, None, 2)), -1),
    "t[..., 1] = row": lambda a, up: a.__setitem__((Ellipsis, 1), up(np.arange(4.0))),
    "t[None, 0] = 3": lambda a, up: a.__setitem__((None, 0), 3),
    "t[:] = other": lambda a, up: a.__setitem__(slice(None), up(BASE[::-1] * 2)),
    "t[()] = 1": lambda a, up: a.__setitem__((), 1),
    "t[1:-1, 1:-1] = stencil": lambda a, up: a.__setitem__(
        (slice(1, -1), slice(1, -1)), a[:-2, 1:-1] + a[2:, 1:-1] - a[1:-1, :-2]),
    # masks and integer arrays, as numpy arrays, lists and tensors
    "t[t > 0] = 0": lambda a, up: a.__setitem__(a > 0, 0),
    "t[t > 0] = t[t > 0] ** -1.5": lambda a, up: a.__setitem__(a > 0, a[a > 0] ** -1.5),
    "t[mask] = values": lambda a, up: a.__setitem__(up(MASK), up(np.arange(MASK.sum()) * 1.0)),
    "t[numpy mask] = 2": lambda a, up: a.__setitem__(MASK, 2),
    "t[[0, 2]] = 1": lambda a, up: a.__setitem__([0, 2], 1),
    "t[rows] = rows": lambda a, up: a.__setitem__(up(ROWS), up(np.ones((3, 5)))),
    "t[ints, ints] = list": lambda a, up: a.__setitem__(([0, 0, 1], [1, 1, 2]), [1, 2, 3]),
    "t[:, tensor ints] = 4": lambda a, up: a.__setitem__((slice(None), up(np.array([4, 0]))), 4),
    "t[True] = 1": lambda a, up: a.__setitem__(True, 1),
    "t[0-d mask] = 1": lambda a, up: a.__setitem__(up(np.array(False)), 1),
    # augmented assignment
    "t[1:] += 1": lambda a, up: a.__setitem__(slice(1, None), a[1:] + 1),
    "t[mask] *= 2": lambda a, up: a.__setitem__(up(MASK), a[up(MASK)] * 2),
    "t[[0, 0]] += 1 (once, as numpy)": lambda a, up: a.__setitem__([0, 0], a[[0, 0]] + 1),
    # errors: numpy's exception type, at the call
    "t[10] = 1": lambda a, up: a.__setitem__(10, 1),
    "t[0] = [1, 2]": lambda a, up: a.__setitem__(0, [1.0, 2.0]),
    "t[wrong mask] = 1": lambda a, up: a.__setitem__(np.ones(3, bool), 1),
    "t[1.5] = 1": lambda a, up: a.__setitem__(1.5, 1),
    "t[float array] = 1": lambda a, up: a.__setitem__(up(np.array([1.0])), 1),
}


def _in_place(a, up):
    u = a  # another name for the same array sees every in-place update
    a += 1
    a *= up(np.arange(5.0))  # broadcast
    a -= 0.5
    a /= 2
    a **= 2
    a @= up(np.eye(5))
    return a, u


def _out(a, up):
    np.add(a, 1, out=a)
    np.multiply(a, up(np.arange(5.0)), out=a)
    np.sqrt(np.abs(a), out=a)
    np.floor(a[0], out=a[1])  # into a view: reaches the base
    return a


def _at(a, up):
    np.add.at(a, [0, 0, 1], 1)  # unbuffered: row 0 twice
    np.add.at(a, (up(np.array([0, 0, 3])), up(np.array([1, 1, 4]))), up(np.array([1.0, 2, 3])))
    np.maximum.at(a, (slice(None), 0), 3)
    np.negative.at(a, [2])
    return a


def _views(a, up):
    row = a[1]
    row[:] = 7  # through a view: reaches the base
    col = a[:, 2]
    a[0, 2] = -9  # into the base: seen by the view
    transposed = a.T
    transposed[0] += 100  # through a transpose
    deep = a[1:][:, 1:][0]
    deep[0] = 55  # through a view of a view of a view
    expanded = np.expand_dims(a, 0)
    expanded[0, 3] = np.squeeze(expanded)[2]
    swapped = a.swapaxes(0, 1)
    swapped[4, 3] = 42
    a[1:-1, 1:-1][a[1:-1, 1:-1] > 8] = 1  # Game of Life's update, through a temporary view
    for r in a:  # each row a view
        r += 1
    return a, row, col, transposed, deep, expanded, swapped


def _copies_keep_their_values(a, up):
    before = a + 0
    fancy = a[[0, 1]]  # an advanced index copies, in numpy too
    scalar_row = a[2].copy()
    a[0] = 1
    a[[1, 2]] = 2
    return a, before, fancy, scalar_row


def _int_in_place(a, up):
    a = a.astype(np.int64)
    a //= 2
    a %= 5
    a <<= 1
    a &= 6
    a |= 1
    a ^= 3
    a >>= 1
    return a


def _int_refuses_float(a, up):
    a = a.astype(np.int64)
    a += 1.5  # numpy: UFuncTypeError, a TypeError (casting 'same_kind')
    return a


def _out_shape_mismatch(a, up):
    np.add(a, up(np.ones((2, 4, 5))), out=a)
    return a


def _broadcast_view_is_read_only(a, up):
    view = np.broadcast_to(a[0], (3, 5))
    view[0, 0] = 1
    return view


PROGRAMS = {
    **{name: (lambda fn: lambda a, up: (fn(a, up), a)[1])(fn) for name, fn in UPDATES.items()},
    "in place operators": _in_place, "out=": _out, "ufunc.at": _at, "views": _views,
    "copies keep their values": _copies_keep_their_values, "int in place": _int_in_place,
    "int += 1.5": _int_refuses_float, "out= shape mismatch": _out_shape_mismatch,
    "broadcast_to view": _broadcast_view_is_read_only,
}

READS = {
    "t[t > 0]": lambda a, up: a[a > 0],
    "t[mask]": lambda a, up: a[up(MASK)],
    "t[numpy mask]": lambda a, up: a[MASK],
    "t[row mask]": lambda a, up: a[up(np.array([True, False, True, True]))],
    "t[..., column mask]": lambda a, up: a[..., up(np.array([1, 0, 0, 1, 1], bool))],
    "t[no true]": lambda a, up: a[a > 1000],
    "t[list]": lambda a, up: a[[3, 0, 0]],
    "t[rows]": lambda a, up: a[up(ROWS)],
    "t[:, ints]": lambda a, up: a[:, up(np.array([[4, 0], [1, 1]]))],
    "t[ints, ints]": lambda a, up: a[up(np.array([0, 3])), [1, 4]],
    "t[2-d ints]": lambda a, up: a[up(np.array([[1, 2], [3, 0]]))],
    "t[mask][ints]": lambda a, up: a[a > 0][up(np.array([0, 1]))],
    "t[0-d mask]": lambda a, up: a[up(np.array(True))],
    "t[None, ints]": lambda a, up: a[None, up(ROWS)],
    "t[()]": lambda a, up: a[()],
    "t[empty list]": lambda a, up: a[[]],
    "np.nonzero": lambda a, up: np.nonzero(a > 2),
    "t.nonzero": lambda a, up: (a % 4 == 0).nonzero(),
    "np.where(cond)": lambda a, up: np.where(a < 0),
    "np.where(row cond)": lambda a, up: np.where(a[0] < -3),
    "np.argwhere": lambda a, up: np.argwhere(a > 10),
    "np.unique": lambda a, up: np.unique(a // 3),
    "np.unique ints": lambda a, up: np.unique((a % 4).astype(np.int32)),
    "np.unique bool": lambda a, up: np.unique(a > 0),
    "np.unique nans": lambda a, up: np.unique(np.sqrt(a)),  # (nan once, as numpy 2's)
    "np.unique nans apart": lambda a, up: np.unique(np.sqrt(a), equal_nan=False),
    "np.unique all results": lambda a, up: np.unique(a // 4, return_index=True,
                                                     return_inverse=True, return_counts=True),
    "np.unique counts": lambda a, up: np.unique((a % 3).astype(np.int8), return_counts=True),
    "np.unique inverse": lambda a, up: np.unique(a[1] // 5, return_inverse=True),
    "np.unique rows": lambda a, up: np.unique(np.concatenate([a, a[::2]]) // 8, axis=0,
                                              return_index=True, return_inverse=True),
    "np.unique columns": lambda a, up: np.unique(a % 2 == 0, axis=1, return_counts=True),
    "np.unique bad axis": lambda a, up: np.unique(a, axis=2),
    # errors
    "t[wrong mask]": lambda a, up: a[np.ones((4, 4), bool)],
    "t[wrong tensor mask]": lambda a, up: a[up(np.ones((3,), bool))],
    "t[out of bounds numpy]": lambda a, up: a[np.array([0, 7])],
    "t[float list]": lambda a, up: a[[1.5]],
    "np.nonzero 0-d": lambda a, up: np.nonzero(a[0, 0] > 0 if isinstance(a, Tensor)
                                               else np.asarray(a[0, 0] > 0)),
}


def run(program, session, base=BASE):
    """``program`` on numpy and on ``session``: the same arrays, or the same exception type."""
    try:
        with np.errstate(all="ignore"):
            expected = program(base.copy(), lambda x: x)
    except Exception as exc:
        with pytest.raises(type(exc)):
            program(session.asarray(base), session.asarray)
        session.sync()  # nothing failing was sent
        return
    got = program(session.asarray(base), session.asarray)
    expected, got = (x if isinstance(x, tuple) else (x,) for x in (expected, got))
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert isinstance(mine, Tensor)
        assert (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype)
        np.testing.assert_array_equal(mine.numpy(), theirs, strict=True)
    session.sync()


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_updates_as_numpys(session, name):
    run(PROGRAMS[name], session)


@pytest.mark.parametrize("name", list(READS))
def test_mask_and_fancy_reads_as_numpys(session, name):
    run(READS[name], session)


@pytest.fixture(scope="module")
def numexpr_session():
    """A session on a numexpr device that fuses chains of every size."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NUMEXPR_MIN_SIZE_ENV, "0")
        with LocalCluster(workers=1, backend="numexpr", heartbeat=HEARTBEAT) as cluster, \
                cluster.connect() as opened:
            yield opened


@pytest.mark.parametrize("name", ["t[t > 0] = t[t > 0] ** -1.5", "in place operators",
                                  "ufunc.at", "views", "t[1:-1, 1:-1] = stencil"])
def test_updates_on_the_numexpr_device(numexpr_session, name):
    run(PROGRAMS[name], numexpr_session)


@pytest.mark.parametrize("name", ["t[t > 0]", "t[:, ints]", "np.nonzero", "np.unique"])
def test_reads_on_the_numexpr_device(numexpr_session, name):
    run(READS[name], numexpr_session)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_updates_on_the_jax_device(jax_session, name):
    run(PROGRAMS[name], jax_session)


@pytest.mark.parametrize("name", list(READS))
def test_reads_on_the_jax_device(jax_session, name):
    run(READS[name], jax_session)


def test_a_tensor_keeps_its_handle_and_other_tensors_their_values(session):
    t = session.asarray(BASE)
    made_before = t * 1
    first_id = t.id
    t[0] = 0
    assert t.id != first_id  # the handle moved to a new array (copy on write)
    np.testing.assert_array_equal(made_before.numpy(), BASE)
    session.sync()


def test_an_update_writes_in_place_unless_another_tensor_sees_the_array():
    # A --memory-limit that holds the array once, and not twice: only an update written
    # into the array itself fits; one that must copy (a view is in use) is refused.
    n = 10_000
    limit = str(n * 8 * 3 // 2)
    with LocalCluster(workers=1, worker_args=("--memory-limit", limit)) as cluster, \
            cluster.connect() as session:
        expected, t = np.zeros(n), session.zeros(n)
        for a in (expected, t):
            for i in range(3):
                a[i] = i + 1
                a[a > 2] = -1
            np.add.at(a, [0, 0], 1)
        np.testing.assert_array_equal(t.numpy(), expected)
        view = t[::2]
        t[0] = 5
        with pytest.raises(QuotaExceeded, match="memory-limit"):
            t.numpy()
        del view


def test_a_basic_index_taken_again_is_the_same_view_as_the_first_time(session):
    # (the second time, its shape and params are remembered: a stencil's step)
    expected, t = BASE.copy(), session.asarray(BASE)
    for step in range(3):
        for a in (expected, t):
            view, scalar = a[1:-1, 1:], a[2, 3]
            view[0, step] = -step  # through the view: reaches the base
            a[2, 3] = scalar + 10  # (all ints: numpy's scalar, a copy, not a view)
        np.testing.assert_array_equal(view.numpy(), expected[1:-1, 1:])
    np.testing.assert_array_equal(t.numpy(), expected)
    assert t[3, 4].shape == () and session.zeros((2, 2))[1:-1, 1:].shape == (0, 1)
    with pytest.raises(IndexError):
        session.zeros((2, 5))[3, 4]  # in bounds of BASE's shape, not of this one


def test_an_update_taken_again_is_checked_and_written_as_the_first_time(session):
    # (the second time, its params are remembered per target, index and value: a stencil's
    # step; whatever differs is inferred again, with numpy's error at the call)
    expected, t = np.zeros((4, 5), np.int8), session.zeros((4, 5), np.int8)
    rows, other_rows = np.arange(10, dtype=np.int8).reshape(2, 5), np.ones((3, 5), np.int8)
    for step in range(3):
        for a, up in ((expected, np.asarray), (t, session.asarray)):
            a[1:3] = 5 + step
            a[1:3] = up(rows) + step
            a[0] = 100 - step
            view = a[:, 1:]
            view[3] = step  # through a view: reaches the base
        for value in (300, other_rows, 1.5j):  # after the same index took other values
            with pytest.raises(Exception) as numpys:
                expected[1:3] = value
            with pytest.raises(numpys.type):
                t[1:3] = session.asarray(value) if isinstance(value, np.ndarray) else value
        np.testing.assert_array_equal(t.numpy(), expected, strict=True)
    session.sync()


def test_a_write_through_a_reshape_is_refused_and_says_what_to_do(session):
    t = session.asarray(BASE)
    flat = t.reshape(-1)
    with pytest.raises(ValueError, match="reshape.*copy"):
        flat[0] = 1
    with pytest.raises(ValueError, match="reshape of this tensor"):
        t[0] = 1
    copied = flat.copy()
    copied[0] = 1  # a copy is its own
    del flat
    t[0] = 1  # the reshape is gone: nothing can tell
    np.testing.assert_array_equal(t.numpy()[0], 1)
    np.testing.assert_array_equal(copied.numpy()[:5], [1, -5, -4, -3, -2])
    # A reshape of a tensor nobody holds is a tensor like any other
    owned = session.asarray(BASE).reshape(2, 10)
    owned[0] = 3
    np.testing.assert_array_equal(owned.numpy()[0], 3)
    session.sync()


def test_an_out_of_bounds_tensor_index_fails_on_the_device_and_names_the_line(session):
    out_of_bounds_index_fails_on_the_device(session)


def test_an_out_of_bounds_tensor_index_fails_on_the_jax_device_too(jax_session):
    out_of_bounds_index_fails_on_the_device(jax_session)  # (jax's own indexing clamps)


def out_of_bounds_index_fails_on_the_device(session) -> None:
    """A tensor index out of bounds, and a tensor mask selecting too few values, fail on the
    device with numpy's errors, naming the line."""
    t = session.asarray(BASE)
    picked = t[session.asarray(np.array([0, 9]))]  # the client does not know the values
    with pytest.raises(RemoteError, match="out of bounds") as raised:
        picked.numpy()
    assert "test_updates.py" in str(raised.value)
    with pytest.raises(IndexError, match="boolean index did not match"):
        t[session.asarray(np.array([True]))]  # a mask's shape is known: refused at the call
    # How many values a tensor mask selects is known on the device only
    t[t > 12] = session.asarray(np.ones(3))  # (one value is > 12)
    with pytest.raises(RemoteError, match="cannot assign 3 input values"):
        t.numpy()


def test_index_errors_name_the_index_by_shape_and_dtype_never_its_values(session):
    t = session.asarray(BASE)
    for index in (np.arange(100.0) + 12345, session.asarray(np.arange(100.0) + 12345)):
        with pytest.raises(IndexError) as raised:
            t[index]
        assert "shape (100,)" in str(raised.value) and "float64" in str(raised.value)
        assert "12345" not in str(raised.value)
    with pytest.raises(IndexError) as raised:
        t[{"a": 12345}]
    assert "dict" in str(raised.value) and "12345" not in str(raised.value)
    with pytest.raises(TypeError, match="only integer scalar arrays"):
        np.arange(3)[session.asarray(np.array([0, 1]))].__index__()  # (reads: numpy's own)
    session.sync()


def test_a_numpy_array_indexed_by_a_tensor_mask_reads_the_mask(session):
    local = np.arange(3.0)
    local[session.asarray(np.array([True, False, True]))] = 7  # numpy reads the tensor
    np.testing.assert_array_equal(local, [7, 1, 7])


def test_updates_and_data_dependent_shapes_are_refused_inside_a_traced_function(session):
    @fabric.function
    def update(x):
        x[0] = 1
        return x

    @fabric.function
    def select(x):
        return x[x > 0]
    t = session.asarray(BASE)
    with pytest.raises(TraceError, match="update of a tensor"):
        update(t)
    with pytest.raises(TraceError, match="depends on the data"):
        select(t)
    np.testing.assert_array_equal(t.numpy(), BASE)


def test_a_capture_replays_updates(session, shared_cluster):
    t = session.asarray(BASE)
    with fabric.capture(session) as trace:
        u = t * 1
        u[u > 0] = 0
        u[0] += 1
        picked = u[u < 0]
    expected = BASE.copy()
    expected[expected > 0] = 0
    expected[0] += 1
    with shared_cluster.connect(device=1) as other:
        replayed = trace.replay(other, other.asarray(BASE))
        np.testing.assert_array_equal(replayed[u.id].numpy(), expected)
        np.testing.assert_array_equal(replayed[picked.id].numpy(), expected[expected < 0])
    np.testing.assert_array_equal(u.numpy(), expected)


PRINTED = {
    "small": BASE, "int": np.arange(6, dtype=np.int32).reshape(2, 3), "0-d": np.array(2.5),
    "large": np.arange(5000.0), "bool": MASK, "wide": np.linspace(0, 1, 40).reshape(2, 20),
}


class tensor(np.ndarray):
    """numpy's own repr of an array named ``tensor`` (numpy names a subclass by its class)."""


SUMMARISED = {
    "1-d floats": (np.linspace(-1e4, 1e4, 3001), {}),
    "2-d int32": (np.arange(80_000, dtype=np.int32).reshape(200, 400), {}),
    "3-d, one short axis": (np.arange(24_000.0).reshape(40, 3, 200) * 1e-3, {}),
    "complex, options": (np.arange(600.0).reshape(20, 30) * (1 + 2j),
                         {"edgeitems": 2, "threshold": 100, "linewidth": 60}),
    "bool": (np.arange(5000).reshape(50, 100) % 3 == 0, {"edgeitems": 1}),
}


@pytest.mark.parametrize("name", list(SUMMARISED))
def test_a_large_tensor_prints_as_numpy_reading_only_what_numpy_shows(name):
    # A connection that takes no message half as large as the array: only the summary's
    # elements can be read to print it (the array goes up in quarters).
    array, options = SUMMARISED[name]
    with LocalCluster(workers=1) as cluster, fabric.connect(
            cluster.address, token=cluster.token,
            max_message_bytes=array.nbytes // 2) as session:
        t = np.concatenate([session.asarray(part) for part in np.array_split(array, 4)])
        with np.printoptions(**options):
            assert repr(t) == repr(array.view(tensor))
            assert str(t) == str(array) and f"{t}" == f"{array}"
        with pytest.raises(MessageTooLarge):
            t.numpy()  # (the whole array is too large to read here)


@pytest.mark.parametrize("name", list(PRINTED))
def test_printing_shows_numpys_text(session, name):
    array = PRINTED[name]
    t = session.asarray(array)
    assert str(t) == str(array)
    assert f"{t}" == f"{array}"
    numpy_repr = repr(array)
    assert repr(t) == "tensor" + numpy_repr[len("array"):].replace("\n      ", "\n       ")
    if array.ndim == 0:
        assert f"{t:.4f}" == f"{array:.4f}" == "2.5000"
    else:  # numpy's refusal, with numpy's type
        with pytest.raises(TypeError):
            f"{array:.4f}"
        with pytest.raises(TypeError):
            f"{t:.4f}"
