"""numpy's linear algebra and covariance on tensors (``np.linalg.inv``, ``solve``, ``det``,
``eig``, ``eigh``, ``svd``, ``qr``, ``cholesky``, ``slogdet``, ``lstsq``, ``pinv``,
``matrix_rank``, ``norm``, ``np.cov``): NEP 18 handlers, registered in
``fabric.arrays.tensor.ARRAY_FUNCTIONS`` as ``fabric.arrays.numpy_functions``'s are.

Rule: the decompositions and solvers run numpy's own ``np.linalg`` on the worker, one op
each (``fabric.core.ops_functions``); a function with several results gets views of its op's
packed result, in numpy's own result type (``EigResult``, ``SVDResult``, ...). ``norm``,
``matrix_rank`` and ``cov`` are numpy's formulas in tensor ops. Nothing is read back, except
where numpy's result depends on the data (``eig``'s dtype: real where every eigenvalue is;
``lstsq``'s residuals: none unless the rank is full), which the device says in one small
round trip. Errors numpy raises before computing (not square, mismatched shapes) are raised
at the call; those that depend on the values (a singular matrix) are raised by the next
read, as ``fabric.RemoteError``.
"""

from __future__ import annotations

import operator
import string
import warnings
from typing import Any, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from fabric.arrays.tensor import ARRAY_FUNCTIONS, Tensor
from fabric.core.ops import DATA_DEPENDENT_DTYPE
from fabric.core.ops_functions import lstsq_parts, packed_parts

# numpy's own result types of its decompositions (named tuples)
_RESULT_TYPES = {name: type(getattr(np.linalg, name)(np.eye(1))) for name in (
    "eig", "eigh", "svd", "qr", "slogdet")}


def _tensor(a: Any, *others: Any) -> Tensor:
    """``a`` as a tensor of the session of the first tensor among ``a`` and ``others``
    (a numpy array or a list uploaded)."""
    session = next(t.session for t in (a, *others) if isinstance(t, Tensor))
    return session.asarray(a)


def _decomposition(name: str, a: Any, **params: Any) -> Any:
    a = _tensor(a)
    session = a.session
    packed = session.apply(name, (a,), params)
    if name in DATA_DEPENDENT_DTYPE:
        session.resolve_shape(packed)
    parts = packed_parts(name, a.shape, params)
    if len(parts) == 1:  # (svd's singular values alone)
        return packed
    if name == "svd":
        pieces, real = _parts(packed, parts), 1  # (the singular values)
    else:  # the eigenvalues are the first row above the eigenvectors
        pieces, real = [packed[..., 0, :], packed[..., 1:, :]], 0
    if name != "eig" and packed.dtype.kind == "c":  # (numpy's are real: so they are)
        pieces[real] = pieces[real].astype(np.empty(0, packed.dtype).real.dtype)
    return pieces[0] if len(pieces) == 1 else _RESULT_TYPES[name](*pieces)


def _eig(a: Any) -> Any:
    return _decomposition("eig", a)


def _eigh(a: Any, UPLO: str = "L") -> Any:
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    return _decomposition("eigh", a, UPLO=UPLO)


def _svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
         hermitian: bool = False) -> Any:
    return _decomposition("svd", a, full_matrices=bool(full_matrices),
                          compute_uv=bool(compute_uv), hermitian=bool(hermitian))


def _real_part(x: Tensor) -> Tensor:
    return x.session.apply("real", (x,), {}) if x.dtype.kind == "c" else x


def _parts(packed: Tensor, parts: list[tuple[int, tuple[int, ...]]]) -> list[Tensor]:
    """The results packed side by side along ``packed``'s last axis, each a view in its
    shape (``packed_parts``, ``lstsq_parts``)."""
    pieces, start = [], 0
    for length, shape in parts:
        pieces.append(packed[..., start:start + length].reshape(shape))
        start += length
    return pieces


def _qr(a: Any, mode: str = "reduced") -> Any:
    """numpy's ``QRResult`` of Q and R (mode 'reduced' or 'complete'), or R alone (mode
    'r'): one op, its packed result viewed in parts."""
    if mode == "raw":
        raise TypeError("numpy.linalg.qr's mode 'raw' (LAPACK's own arrays) is not supported "
                        "on fabric tensors: take mode='reduced' or 'complete', or read the "
                        "tensor with .numpy() first.")
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"Unrecognized mode '{mode}'")
    a = _tensor(a)
    params = {"mode": "reduced" if mode == "r" else mode}
    q, r = _parts(a.session.apply("qr", (a,), params), packed_parts("qr", a.shape, params))
    return r if mode == "r" else _RESULT_TYPES["qr"](q, r)


def _slogdet(a: Any) -> Any:
    """numpy's ``SlogdetResult``: the sign and the natural log of the magnitude of each
    determinant (the log real, also of a complex matrix)."""
    a = _tensor(a)
    packed = a.session.apply("slogdet", (a,), {})
    return _RESULT_TYPES["slogdet"](packed[..., 0], _real_part(packed[..., 1]))


def _cholesky(a: Any, /, *, upper: bool = False) -> Tensor:
    """The lower Cholesky factor of each matrix, or the upper one (its conjugate
    transpose)."""
    a = _tensor(a)
    lower = a.session.apply("cholesky", (a,), {})
    if not upper:
        return lower
    return np.swapaxes(np.conjugate(lower) if lower.dtype.kind == "c" else lower, -1, -2)


def _lstsq(a: Any, b: Any, rcond: Any = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """numpy's ``(x, residuals, rank, s)``: one op for the solution, the singular values and
    the rank (its packed result viewed in parts), one for the residuals, whose length (none
    unless the rank is full) the device says."""
    a = _tensor(a, b)
    session = a.session
    b = session.asarray(b)
    params = {} if rcond is None else {"rcond": float(rcond)}
    solution, values, rank = _parts(session.apply("lstsq", (a, b), params),
                                    lstsq_parts(a.shape, b.shape))
    residuals = session.apply("lstsq_residuals", (a, b), params)
    session.resolve_shape(residuals)
    return solution, residuals, _real_part(rank).astype(np.int32), _real_part(values)


def _pinv(a: Any, rcond: Any = None, hermitian: bool = False, **rtol: Any) -> Tensor:
    """numpy's ``pinv``: singular values below ``rcond`` (or ``rtol``; by default 1e-15,
    numpy's, and with ``rtol=None`` the array API's ``max(M, N)`` times epsilon) times the
    largest count as zero; either may be a tensor, broadcast against the stack."""
    if set(rtol) - {"rtol"}:
        raise TypeError(f"pinv() got an unexpected keyword argument {next(iter(rtol))!r}")
    if rcond is not None and rtol:
        raise ValueError("`rtol` and `rcond` can't be both set.")
    cut = rcond if rcond is not None else rtol.get("rtol", 1e-15)
    a = _tensor(a, cut)
    params = {"hermitian": bool(hermitian)}
    if isinstance(cut, (Tensor, list, np.ndarray)):
        return a.session.apply("pinv", (a, cut), params)
    return a.session.apply("pinv", (a,), {**params, "rtol": None if cut is None else float(cut)})


def _matrix_rank(A: Any, tol: Any = None, hermitian: bool = False, *,
                 rtol: Any = None) -> Tensor:
    """numpy's ``matrix_rank``: how many singular values of each matrix exceed ``tol``, or
    ``rtol`` (default ``max(M, N)`` times epsilon) times the largest (a vector's rank: 1
    unless it is all zeros, as a 0-d tensor)."""
    A = _tensor(A)
    if A.ndim < 2:
        return np.any(A != 0).astype(np.intp)
    values = _svd(A, compute_uv=False, hermitian=hermitian)
    if tol is None:
        if rtol is None:
            rtol = max(A.shape[-2:]) * float(np.finfo(values.dtype).eps)
        elif np.ndim(rtol):
            rtol = A.session.asarray(rtol)[..., None]
        tol = values.max(axis=-1, keepdims=True) * rtol
    elif np.ndim(tol):
        tol = A.session.asarray(tol)[..., None]
    return (values > tol).sum(axis=-1)


def _solve(a: Any, b: Any) -> Tensor:
    a = _tensor(a, b)
    return a.session.apply("solve", (a, b), {})


def _vector_norm(x: Tensor, ord: Any, axis: int, keepdims: bool) -> Tensor:
    if ord == np.inf:  # (numpy's maxima start from 0: an empty norm is 0, not an error)
        return abs(x).max(axis=axis, keepdims=keepdims, initial=0)
    if ord == -np.inf:
        return abs(x).min(axis=axis, keepdims=keepdims)
    if ord == 0:
        return (x != 0).astype(x.dtype).sum(axis=axis, keepdims=keepdims)
    if ord == 1:
        return abs(x).sum(axis=axis, keepdims=keepdims)
    if ord is None or ord == 2:
        return np.sqrt((x * x).sum(axis=axis, keepdims=keepdims))
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    return (abs(x) ** ord).sum(axis=axis, keepdims=keepdims) ** (1.0 / ord)


def _matrix_norm(x: Tensor, ord: Any, axes: tuple[int, int]) -> Tensor:
    row, col = axes
    if ord in (2, -2, "nuc"):
        values = _svd(np.moveaxis(x, (row, col), (-2, -1)), compute_uv=False)
        if ord == -2:
            return values.min(axis=-1)
        return (values.max if ord == 2 else values.sum)(axis=-1, initial=0)
    if ord in (1, -1):
        sums, axis = abs(x).sum(axis=row), col - (col > row)
        return sums.max(axis=axis, initial=0) if ord == 1 else sums.min(axis=axis)
    if ord in (np.inf, -np.inf):
        sums, axis = abs(x).sum(axis=col), row - (row > col)
        return sums.max(axis=axis, initial=0) if ord == np.inf else sums.min(axis=axis)
    if ord in (None, "fro", "f"):
        return np.sqrt((x * x).sum(axis=axes))
    raise ValueError("Invalid norm order for matrices.")


def _norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Tensor:
    """numpy.linalg.norm's formulas, on the device (complex tensors: their magnitudes)."""
    x = _tensor(x)
    if x.dtype.kind == "c":
        x = abs(x)
    elif x.dtype.kind != "f":
        x = x.astype(float)
    if axis is None:
        if ord is None or ord in ("f", "fro") and x.ndim == 2 or ord == 2 and x.ndim == 1:
            result = np.sqrt((x * x).sum())
            return result.reshape((1,) * x.ndim) if keepdims else result
        axis = tuple(range(x.ndim))
    axes = normalize_axis_tuple(axis if isinstance(axis, tuple) else operator.index(axis),
                                x.ndim)
    if len(axes) == 1:
        return _vector_norm(x, ord, axes[0], keepdims)
    if len(axes) != 2:
        raise ValueError("Improper number of dimensions to norm.")
    result = _matrix_norm(x, ord, axes)
    if keepdims:
        shape = list(x.shape)
        shape[axes[0]] = shape[axes[1]] = 1
        result = result.reshape(tuple(shape))
    return result


def contract(a: Tensor, b: Tensor, axes_a: Sequence[int], axes_b: Sequence[int]) -> Tensor:
    """The sum of the products of ``a`` and ``b`` over the paired axes (``axes_a[i]`` of
    ``a`` with ``axes_b[i]`` of ``b``, both counted from 0), ``a``'s other axes then ``b``'s:
    one ``einsum`` on the device (which broadcasts a paired axis of length one)."""
    letters = iter(string.ascii_letters)
    left = [next(letters) for _ in range(a.ndim)]
    right = [next(letters) for _ in range(b.ndim)]
    for axis_a, axis_b in zip(axes_a, axes_b):
        right[axis_b] = left[axis_a]
    out = [c for n, c in enumerate(left) if n not in axes_a] + \
        [c for n, c in enumerate(right) if n not in axes_b]
    return np.einsum(f"{''.join(left)},{''.join(right)}->{''.join(out)}", a, b)


def _tensordot(a: Any, b: Any, axes: Any = 2) -> Tensor:
    """numpy.tensordot: the last ``axes`` axes of ``a`` with the first of ``b``, or two
    lists (or two axes) paired, of equal lengths (numpy's errors)."""
    a = _tensor(a, b)
    b = _tensor(b, a)
    if isinstance(axes, (int, np.integer)):
        axes_a, axes_b = list(range(a.ndim - axes, a.ndim)), list(range(int(axes)))
    else:
        axes_a, axes_b = ([axis] if isinstance(axis, (int, np.integer)) else list(axis)
                          for axis in axes)
    axes_a, axes_b = normalize_axis_tuple(axes_a, a.ndim), normalize_axis_tuple(axes_b, b.ndim)
    if len(axes_a) != len(axes_b) or any(a.shape[i] != b.shape[j]
                                         for i, j in zip(axes_a, axes_b)):
        raise ValueError("shape-mismatch for sum")
    return contract(a, b, axes_a, axes_b)


def _cov(m: Any, y: Any = None, rowvar: bool = True, bias: bool = False, ddof: Any = None,
         fweights: Any = None, aweights: Any = None, *, dtype: Any = None) -> Tensor:
    """numpy.cov's formula, on the device: each variable's deviations from its mean, their
    products over the observations, divided by their count less ``ddof``."""
    if fweights is not None or aweights is not None:
        raise TypeError("numpy.cov on fabric tensors takes no fweights or aweights; read the "
                        "tensors with .numpy() first to weigh the observations.")
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    for name, given in (("m", m), ("y", y)):
        if np.ndim(given) > 2:
            raise ValueError(f"{name} has more than 2 dimensions")
    m = _tensor(m, y)
    if dtype is None:
        dtype = np.result_type(m.dtype, np.float64)

    def variables(a: Any) -> Tensor:
        a = np.atleast_2d(m.session.asarray(a)).astype(dtype)
        return a.T if not rowvar and a.shape[0] != 1 else a
    x = variables(m)
    if x.shape[0] == 0:
        return m.session.empty((0, 0), dtype)
    if y is not None:
        x = np.concatenate((x, variables(y)), axis=0)
    if ddof is None:
        ddof = 0 if bias else 1
    count = x.shape[1] - ddof
    if count <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        count = 0.0
    x = x - x.mean(axis=1)[:, None]
    products = np.dot(x, np.conjugate(x.T) if x.dtype.kind == "c" else x.T)
    with np.errstate(divide="ignore"):
        return (products * float(np.true_divide(1, count))).squeeze()


ARRAY_FUNCTIONS.update({
    np.linalg.norm: _norm,
    np.linalg.inv: lambda a: a.session.apply("inv", (a,), {}),
    np.linalg.det: lambda a: a.session.apply("det", (a,), {}),
    np.linalg.solve: _solve,
    np.linalg.eig: _eig,
    np.linalg.eigh: _eigh,
    np.linalg.svd: _svd,
    np.linalg.qr: _qr,
    np.linalg.slogdet: _slogdet,
    np.linalg.cholesky: _cholesky,
    np.linalg.lstsq: _lstsq,
    np.linalg.pinv: _pinv,
    np.linalg.matrix_rank: _matrix_rank,
    np.cov: _cov,
    np.tensordot: _tensordot,
})
