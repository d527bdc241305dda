"""The array API namespace of a session (``fabric.array_api``), against a real cluster: what
``t.__array_namespace__()`` returns, its info, the array attributes the standard adds
(``device``, ``to_device``, ``mT``, ``__complex__``, ``__dlpack__``), creation on another
device, the
standard's rules where numpy's differ, and that no function reads a tensor back.

(``test_array_api_differential.py`` compares every function's values with array-api-strict.)
"""

from __future__ import annotations

import numpy as np
import pytest

import fabric.array_api as namespace_package
from fabric import Tensor


@pytest.fixture
def xp(session):
    return session.asarray([0.0]).__array_namespace__()


def test_a_tensor_names_its_sessions_namespace(session, xp) -> None:
    t = session.asarray(np.arange(6.0).reshape(2, 3))
    assert t.__array_namespace__() == xp and xp.session is session
    assert t.__array_namespace__(api_version="2023.12") == xp
    assert len({xp, t.__array_namespace__()}) == 1  # (a library gathers one namespace)
    assert xp.__array_api_version__ == "2025.12" == namespace_package.__array_api_version__
    with pytest.raises(ValueError, match="2024.12"):
        t.__array_namespace__(api_version="2019.01")
    for name in ("float32", "complex128", "e", "pi", "nan", "inf", "newaxis", "sin", "concat",
                 "unique_all", "linalg", "astype", "asarray", "cumulative_sum"):
        assert hasattr(xp, name), name
    assert xp.float64 == t.dtype and xp.linalg.vector_norm is namespace_package.linalg.vector_norm


def test_info_names_the_clusters_devices_and_the_defaults(shared_cluster, session, xp) -> None:
    info = xp.__array_namespace_info__()
    assert [d.index for d in info.devices()] == [0, 1]
    assert info.default_device() == session.device
    assert info.capabilities()["data-dependent shapes"] is True
    assert info.capabilities()["boolean indexing"] is True
    assert info.default_dtypes() == {"real floating": xp.float64, "complex floating":
                                     xp.complex128, "integral": xp.int64, "indexing": xp.int64}
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8",
                                                 "uint16", "uint32", "uint64"}
    assert len(info.dtypes()) == 13


def test_device_to_device_and_creation_on_another_device(session, xp) -> None:
    other = xp.__array_namespace_info__().devices()[1]
    t = xp.arange(4.0)
    assert t.device == session.device and {t.device: 0}  # (a device is a key, too)
    there = xp.zeros(4, device=other)
    assert there.device == other and there.session is not session
    assert xp.ones(2, device=other).session is there.session  # (one session per device)
    moved = t.to_device(other)
    assert moved.session is there.session
    back = (moved + there).to_device(session.device)
    assert back.session is session  # (the session it came from, not a third)
    np.testing.assert_array_equal((back + t).numpy(), [0.0, 2.0, 4.0, 6.0])
    read = t.to_device("cpu")
    assert type(read) is np.ndarray and read.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert xp.asarray(t, device=other).session is there.session
    with pytest.raises(TypeError, match="to_device"):
        xp.zeros(2, device="cpu")


def test_array_attributes(session, xp) -> None:
    stack = xp.reshape(xp.arange(12), (2, 2, 3))
    assert stack.mT.shape == (2, 3, 2)
    np.testing.assert_array_equal(stack.mT.numpy(),
                                  np.arange(12).reshape(2, 2, 3).swapaxes(-1, -2))
    with pytest.raises(ValueError, match="2 dimensions"):
        xp.arange(3).mT
    assert complex(xp.asarray(1.5 - 2j)) == 1.5 - 2j  # (not float's)
    exported = xp.asarray([1, 2, 3], dtype=xp.int16)
    assert exported.__dlpack_device__() == (1, 0)  # (what it exports is read to this host)
    assert np.from_dlpack(exported).tolist() == [1, 2, 3]
    assert xp.from_dlpack(np.arange(2.0)).device == session.device
    assert complex(xp.asarray(3)) == 3 + 0j


def test_the_standards_rules_where_numpys_differ(session, xp) -> None:
    z = xp.asarray([1 + 2j, -3j])
    with pytest.raises(TypeError, match="real"):
        xp.astype(z, xp.float64)
    assert xp.astype(z, xp.complex128, copy=False) is z
    full = xp.full((2,), 1 - 1j)  # (no op's params carry a complex: a 0-d upload, broadcast)
    assert full.dtype == xp.complex128 and full.numpy().tolist() == [1 - 1j, 1 - 1j]
    assert xp.add(z, 2j).numpy().tolist() == [1 + 4j, -1j]
    assert xp.multiply(xp.asarray([1.0], dtype=xp.float32), 2j).dtype == xp.complex64
    clipped = xp.clip(xp.asarray([1, 5, 9], dtype=xp.int8), xp.asarray(2), 6)
    assert clipped.dtype == xp.int8 and clipped.numpy().tolist() == [2, 5, 6]
    nans = xp.asarray([np.nan, 1.0, np.nan])
    assert xp.unique_values(nans).shape == (3,)  # (NaNs each apart, as the standard says)
    assert xp.argsort(xp.asarray([1, 3, 1]), descending=True).numpy().tolist() == [1, 0, 2]
    counted = xp.cumulative_sum(xp.asarray([1, 2]), include_initial=True)
    assert counted.numpy().tolist() == [0, 1, 3]
    assert xp.can_cast(xp.int64, xp.float64) is False  # (numpy's 'safe' says True)
    with pytest.raises(ValueError, match="axis"):
        xp.cumulative_sum(xp.ones((2, 2)))


def test_numpys_dtypes_and_scalars_are_taken_as_numpy_2_takes_them(session, xp) -> None:
    # (xarray passes them: its fill values are numpy scalars, da.astype(np.float32) a type)
    single = xp.asarray([1.0, -2.0], dtype=np.float32)
    assert single.dtype == xp.float32 and xp.astype(single, np.int8).dtype == xp.int8
    assert xp.zeros(2, dtype=np.uint16).dtype == xp.uint16
    assert xp.isdtype(np.float64, "real floating")
    kept = xp.where(single > 0, single, np.float32(np.nan))
    assert kept.dtype == xp.float32 and np.isnan(kept.numpy()[1])
    assert xp.add(single, np.float64(1)).dtype == xp.float64  # (a numpy scalar's dtype counts)
    assert xp.result_type(single, np.float64(1)) == xp.float64 == xp.result_type(1.0, xp.float64)
    with pytest.raises(TypeError, match="Python scalars alone"):  # (xarray asks, and goes on)
        xp.result_type(1.0)
    with pytest.raises(TypeError, match="array API standard"):
        xp.add(single, np.float16(1))
    with pytest.raises(TypeError, match="array API standard"):
        xp.astype(single, np.float16)


def test_functions_of_tensors_read_nothing(session, xp, monkeypatch) -> None:
    a = xp.reshape(xp.arange(1.0, 7.0), (2, 3))
    results = []
    monkeypatch.setattr(session, "read", lambda *_: pytest.fail("a function read a tensor"))
    for function in (xp.sin, xp.abs, xp.round, xp.real, xp.conj):
        results.append(function(a))
    results += [xp.add(a, 1), xp.pow(a, 2.0), xp.where(a > 2, a, 0.0), xp.clip(a, 2, 4),
                xp.sum(a, axis=0), xp.mean(a), xp.std(a, correction=1), xp.argmax(a, axis=1),
                xp.cumulative_prod(a, axis=1), xp.sort(a, descending=True), xp.flip(a),
                xp.concat([a, a]), xp.stack([a, a], axis=1), xp.matmul(a, a.mT),
                xp.tensordot(a, a, axes=([1], [1])), xp.vecdot(a, a), xp.roll(a, 1),
                xp.linalg.vector_norm(a, ord=3), xp.linalg.matrix_norm(a, ord="nuc"),
                xp.linalg.inv(xp.matmul(a, a.mT)), xp.linalg.trace(xp.eye(3)),
                xp.linalg.diagonal(a), xp.take(a, xp.asarray([0, 0]), axis=0),
                xp.take_along_axis(a, xp.asarray([[0], [2]]), axis=1), xp.tril(a),
                xp.searchsorted(xp.arange(5.0), a), xp.count_nonzero(a > 3),
                xp.diff(a, axis=1, prepend=a[:, :1]), xp.tile(a, (2, 1)), xp.repeat(a, 2)]
    assert all(isinstance(r, Tensor) for r in results)
    monkeypatch.undo()
    assert xp.sum(results[-1]).numpy() == 42.0


def test_refusals_say_what_to_do(session, xp) -> None:
    with pytest.raises(TypeError, match="xp.asarray"):
        xp.sin(np.arange(3.0))
    with pytest.raises(TypeError, match="at least one fabric"):
        xp.add(1, 2)
    with pytest.raises(TypeError, match="array API standard"):
        xp.zeros(2, dtype="float16")
    with pytest.raises(TypeError, match="integer tensor"):
        xp.repeat(xp.arange(3), xp.asarray([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="copy"):
        xp.asarray([1.0], copy=False)


def test_the_2025_12_revisions_additions(session, xp) -> None:
    a, b = np.array([[3, 1, 2, 3], [5, 1, 0, 7]]), np.array([2, 7, 9])
    before = session.stats()["reads"]
    found = [xp.isin(xp.asarray(a), xp.asarray(b)), xp.isin(xp.asarray(a), 3, invert=True),
             xp.isin(7, xp.asarray(b)), xp.isin(xp.asarray(a), xp.asarray(b[:0])),
             xp.isin(xp.asarray([1.5, np.nan, -0.0]), xp.asarray([0.0, np.nan]))]
    assert session.stats()["reads"] == before  # (sorted and searched on the device)
    expected = [np.isin(a, b), np.isin(a, 3, invert=True), np.isin(7, b), np.zeros_like(a, bool),
                np.array([False, False, True])]
    for f, e in zip(found, expected):
        assert f.dtype == np.bool_ and f.numpy().tolist() == e.tolist()
    assert xp.broadcast_shapes((2, 1), (3,)) == (2, 3)
    rotation = xp.asarray(np.array([[0.0, -1.0], [1.0, 0.0]], np.float32))
    values, vectors = xp.linalg.eig(rotation)
    assert (values.dtype, vectors.dtype) == (xp.complex64, xp.complex64)
    real = xp.linalg.eigvals(xp.asarray([[2.0, 1.0], [0.0, 3.0]]))  # (numpy's would be real)
    assert real.dtype == xp.complex128 and sorted(real.numpy().real.tolist()) == [2, 3]
    assert sorted(values.numpy().tolist(), key=lambda z: z.imag) == [-1j, 1j]
    with pytest.raises(TypeError, match="astype"):
        xp.linalg.eig(xp.asarray([[1, 2], [3, 4]]))
    assert int(xp.searchsorted(xp.asarray([1.0, 2.0, 3.0]), 2.5)) == 2
    grids = xp.meshgrid(xp.arange(3.0), xp.arange(2.0))
    assert type(grids) is tuple and [g.shape for g in grids] == [(2, 3), (2, 3)]
    assert type(xp.broadcast_arrays(xp.ones((2, 1)), xp.ones(3))) is tuple
    assert type(xp.__array_namespace_info__().devices()) is tuple
    assert session.asarray([0]).__array_namespace__(api_version="2025.12") == xp


def test_eye_takes_any_int_diagonal(session, xp) -> None:
    for k in (2**70, -(2**63) - 1, 3, -1):  # (past the last diagonal: zeros, as numpy's)
        assert xp.eye(3, 2, k=k).numpy().tolist() == np.eye(3, 2, k=max(-3, min(k, 2))).tolist()


def test_vecdot_broadcasts_every_axis_but_its_own(session, xp) -> None:
    with pytest.raises(ValueError, match="differ along axis -1"):  # (numpy's would broadcast)
        xp.vecdot(xp.ones((1, 0)), xp.ones(1))
    assert xp.vecdot(xp.ones((2, 3)), xp.ones((1, 3))).numpy().tolist() == [3.0, 3.0]
