"""The standard's ``linalg`` extension on tensors (``xp.linalg``): numpy's ``np.linalg`` on
tensors (``fabric.arrays.numpy_linalg``: one op per decomposition or solver, ``matrix_rank``
a composite) under the standard's signatures, and the norms, ``trace``, ``diagonal``,
``cross``, ``outer`` and ``matrix_power`` as composites of tensor ops.

Rule: as ``fabric.arrays.numpy_linalg``'s: errors numpy raises before computing come at the
call, those that depend on the values (a singular matrix) from the next read, as
``fabric.RemoteError``; nothing is read here. Results keep the standard's real dtype of a
complex input's norms and singular values (complex64 gives float32).
"""

from __future__ import annotations

import builtins
import math
from typing import Any, NamedTuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.array_api.elementwise import tensor_argument
from fabric.array_api.functions import (broadcast_arrays, matmul, matrix_transpose, tensordot,
                                        vecdot)
from fabric.arrays.tensor import Tensor

__all__ = ["cholesky", "cross", "det", "diagonal", "eig", "eigh", "eigvals", "eigvalsh", "inv",
           "matmul", "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
           "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot",
           "vector_norm"]


def cholesky(x: Tensor, /, *, upper: builtins.bool = False) -> Tensor:
    """The Cholesky factor of each Hermitian positive-definite matrix: lower, or ``upper``
    (its conjugate transpose)."""
    return np.linalg.cholesky(tensor_argument(x, "cholesky"), upper=upper)


def det(x: Tensor, /) -> Tensor:
    """The determinant of each square matrix."""
    return np.linalg.det(tensor_argument(x, "det"))


def inv(x: Tensor, /) -> Tensor:
    """The inverse of each square matrix."""
    return np.linalg.inv(tensor_argument(x, "inv"))


def solve(x1: Tensor, x2: Tensor, /) -> Tensor:
    """The solution of ``x1 @ result = x2`` (``x2`` a vector only when it is 1-d)."""
    return np.linalg.solve(tensor_argument(x1, "solve"), tensor_argument(x2, "solve"))


def qr(x: Tensor, /, *, mode: str = "reduced") -> Any:
    """``Q, R`` of each matrix ('reduced': Q of min(M, N) columns; 'complete': square Q), as
    numpy's ``QRResult``."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"qr's mode is 'reduced' or 'complete', not {mode!r}.")
    return np.linalg.qr(tensor_argument(x, "qr"), mode=mode)


def slogdet(x: Tensor, /) -> Any:
    """The sign and the natural log of the magnitude of each square matrix's determinant, as
    numpy's ``SlogdetResult`` (the log real, also of a complex matrix)."""
    return np.linalg.slogdet(tensor_argument(x, "slogdet"))


def eigh(x: Tensor, /) -> Any:
    """The eigenvalues (ascending) and eigenvectors of each Hermitian matrix, as numpy's
    ``EighResult``."""
    return np.linalg.eigh(tensor_argument(x, "eigh"))


class EigResult(NamedTuple):
    """``eig``'s results (2025.12): complex, whatever the eigenvalues are."""

    eigenvalues: Tensor
    eigenvectors: Tensor


def eig(x: Tensor, /) -> EigResult:
    """The eigenvalues and right eigenvectors of each square matrix of floating point
    (2025.12), complex of ``x``'s precision even where every eigenvalue is real (numpy's are
    real there: which the device says, one small round trip)."""
    x = tensor_argument(x, "eig")
    if x.dtype.kind not in "fc":
        raise TypeError(f"eig takes a floating-point tensor, not {x.dtype}: cast it with "
                        "xp.astype first.")
    wanted = np.result_type(x.dtype, np.complex64)
    return EigResult(*(part if part.dtype == wanted else part.astype(wanted)
                       for part in np.linalg.eig(x)))


def eigvals(x: Tensor, /) -> Tensor:
    """The eigenvalues of each square matrix of floating point (2025.12), complex as
    ``eig``'s (numpy's ``eig`` on the device: its vectors computed too)."""
    return eig(x).eigenvalues


def eigvalsh(x: Tensor, /) -> Tensor:
    """The eigenvalues (ascending) of each Hermitian matrix (numpy's eigvalsh: no vectors)."""
    x = tensor_argument(x, "eigvalsh")
    return x.session.apply("eigvalsh", (x,), {})


def svd(x: Tensor, /, *, full_matrices: builtins.bool = True) -> Any:
    """``U, S, Vh`` of each matrix, as numpy's ``SVDResult``."""
    return np.linalg.svd(tensor_argument(x, "svd"), full_matrices=full_matrices)


def svdvals(x: Tensor, /) -> Tensor:
    """The singular values of each matrix, descending."""
    return np.linalg.svd(tensor_argument(x, "svdvals"), compute_uv=False)


def pinv(x: Tensor, /, *, rtol: float | Tensor | None = None) -> Tensor:
    """The pseudo-inverse of each matrix; singular values below ``rtol`` (a float, or a tensor
    broadcast against the stack) times the largest count as zero (default: ``max(M, N)``
    times the dtype's epsilon)."""
    return np.linalg.pinv(tensor_argument(x, "pinv"), rtol=rtol)


def _real_dtype(x: Tensor) -> np.dtype:
    return np.empty(0, x.dtype).real.dtype if x.dtype.kind in "fc" else np.dtype(np.float64)


def matrix_rank(x: Tensor, /, *, rtol: float | None = None) -> Tensor:
    """How many singular values of each matrix exceed ``rtol`` times the largest (default:
    ``max(M, N)`` times the dtype's epsilon)."""
    return np.linalg.matrix_rank(tensor_argument(x, "matrix_rank"), rtol=rtol)


def matrix_power(x: Tensor, n: int, /) -> Tensor:
    """Each square matrix to the integer power ``n`` (negative: of its inverse), by repeated
    squaring."""
    x = tensor_argument(x, "matrix_power")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError("matrix_power takes a stack of square matrices.")
    given = x
    if n < 0:
        x, n = inv(x), -n
    result = None
    while n:
        if n & 1:
            result = x if result is None else matmul(result, x)
        n >>= 1
        if n:
            x = matmul(x, x)
    if result is None:
        identity = x.session.eye(x.shape[-1], dtype=x.dtype)
        return np.broadcast_to(identity, x.shape).copy()
    return result.copy() if result is given else result


def diagonal(x: Tensor, /, *, offset: int = 0) -> Tensor:
    """Diagonal ``offset`` of each matrix (above the main one when positive)."""
    x = tensor_argument(x, "diagonal")
    if x.ndim < 2:
        raise ValueError("diagonal takes a tensor of at least 2 dimensions.")
    rows, cols = x.shape[-2:]
    length = max(0, min(rows - max(-offset, 0), cols - max(offset, 0)))
    first = x.session.arange(max(-offset, 0), max(-offset, 0) + length)
    return x[..., first, first + offset]


def trace(x: Tensor, /, *, offset: int = 0, dtype: Any = None) -> Tensor:
    """The sum of diagonal ``offset`` of each matrix (integers in the default integer dtype
    of their signedness, as ``sum``)."""
    return diagonal(x, offset=offset).sum(axis=-1, dtype=dtype)


def outer(x1: Tensor, x2: Tensor, /) -> Tensor:
    """The outer product of two vectors."""
    x1, x2 = tensor_argument(x1, "outer"), tensor_argument(x2, "outer")
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError("outer takes two 1-d tensors.")
    return x1[:, None] * x2[None, :]


def cross(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """The cross product of the 3-vectors along ``axis``, the other axes broadcast."""
    x1, x2 = broadcast_arrays(tensor_argument(x1, "cross"), tensor_argument(x2, "cross"))
    axis = normalize_axis_index(axis, x1.ndim)
    if x1.shape[axis] != 3:
        raise ValueError(f"cross takes vectors of 3 elements along axis {axis}, not "
                         f"{x1.shape[axis]}.")
    a = [np.moveaxis(x1, axis, -1)[..., i] for i in range(3)]
    b = [np.moveaxis(x2, axis, -1)[..., i] for i in range(3)]
    parts = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    return np.moveaxis(np.stack(parts, axis=-1), -1, axis)


def vector_norm(x: Tensor, /, *, axis: int | tuple[int, ...] | None = None,
                keepdims: builtins.bool = False, ord: float = 2) -> Tensor:
    """The ``ord``-norm of the vectors along ``axis`` (all elements as one vector with None),
    in the real dtype of ``x``'s precision."""
    x = tensor_argument(x, "vector_norm")
    axes = tuple(range(x.ndim)) if axis is None else normalize_axis_tuple(axis, x.ndim)
    size = abs(x).astype(_real_dtype(x)) if x.dtype.kind not in "fc" else abs(x)
    if ord == math.inf:
        found = size.max(axis=axes, keepdims=keepdims, initial=0)
    elif ord == -math.inf:
        found = size.min(axis=axes, keepdims=keepdims)
    elif ord == 0:
        found = (size != 0).astype(size.dtype).sum(axis=axes, keepdims=keepdims)
    elif ord == 1:
        found = size.sum(axis=axes, keepdims=keepdims)
    elif ord == 2:
        found = np.sqrt((size * size).sum(axis=axes, keepdims=keepdims))
    else:
        found = ((size ** float(ord)).sum(axis=axes, keepdims=keepdims)) ** (1.0 / ord)
    return found


def matrix_norm(x: Tensor, /, *, keepdims: builtins.bool = False,
                ord: float | str = "fro") -> Tensor:
    """The ``ord``-norm of each matrix ('fro', 'nuc', 1, 2, inf and their negatives)."""
    x = tensor_argument(x, "matrix_norm")
    found = np.linalg.norm(x, ord, axis=(-2, -1), keepdims=keepdims)
    real = _real_dtype(x)
    return found if found.dtype == real else found.astype(real)
