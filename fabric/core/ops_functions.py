"""The op table's entries for numpy's everyday functions: linear algebra, ``np.fft``'s
transforms, ``np.pad``, ``np.bincount``: their implementations, and the shape and dtype rules
``fabric.core.ops`` lists them with.

Rule: each op runs numpy's own function on the worker (``np.linalg``'s LAPACK calls, never a
hand-written algorithm; another array module's function of the same name on its devices),
and its rules restate only what numpy's function would check before computing: square
matrices, matching core dimensions, pad widths. A function with several
results (``eig``, ``eigh``, ``svd``, ``qr``, ``slogdet``, ``lstsq``) is one op whose result
packs them along its last axes (``packed_parts`` says where each lies), so the decomposition
runs once; the client hands the user views of the parts (``lstsq``'s residuals, whose length
depends on the rank, are an op of their own). This module needs only numpy and the rules'
module (the table's module imports it).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from fabric.core.op_rules import Shape, small_shape


def _shape(arg: Any) -> Shape:
    # a tensor's (a Spec's) shape, or a scalar's ()
    return tuple(getattr(arg, "shape", ()))


def _square(op: Any, shape: Shape) -> None:
    """numpy.linalg's checks of a stack of square matrices, with its errors."""
    if len(shape) < 2:
        raise np.linalg.LinAlgError(f"{len(shape)}-dimensional array given. Array must be at "
                                    "least two-dimensional")
    if op.name not in ("svd", "qr") and shape[-1] != shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")


def square_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """inv: the matrices' own shape."""
    _square(op, _shape(args[0]))
    return _shape(args[0])


def eigenvalues_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """eigvalsh: one value per row of each square matrix."""
    _square(op, _shape(args[0]))
    return _shape(args[0])[:-1]


def pinv_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """pinv: each matrix's transposed shape (any matrix, square or not)."""
    shape = _shape(args[0])
    if len(shape) < 2:
        raise np.linalg.LinAlgError(f"{len(shape)}-dimensional array given. Array must be at "
                                    "least two-dimensional")
    return shape[:-2] + (shape[-1], shape[-2])


def det_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """det: one value per matrix."""
    _square(op, _shape(args[0]))
    return _shape(args[0])[:-2]


def solve_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """solve(a, b): numpy 2's rule, b a vector only when it is 1-d, else a stack of
    matrices of right-hand sides."""
    a, b = _shape(args[0]), _shape(args[1])
    _square(op, a)
    vector = len(b) == 1
    if not b or b[-1 if vector else -2] != a[-1]:
        raise ValueError(f"solve: Input operand 1 has a mismatch in its core dimension 0, with "
                         f"gufunc signature (m,m),(m{'' if vector else ',n'})->"
                         f"(m{'' if vector else ',n'}) (size {b[-1 if vector else -2] if b else 0}"
                         f" is different from {a[-1]})")
    if vector:
        return a[:-2] + b
    return np.broadcast_shapes(a[:-2], b[:-2]) + b[-2:]


def packed_parts(name: str, shape: Shape, params: dict[str, Any]) -> list[tuple[int, Shape]]:
    """Where each result of decomposition ``name`` of matrices of ``shape`` lies in its
    packed op's result: (length along the packed result's last axis, the part's shape), in
    numpy's order of results. eig and eigh pack the eigenvalues as the first row above the
    eigenvectors; svd packs U, S and Vh, each flattened, side by side."""
    batch, m, n = shape[:-2], shape[-2], shape[-1]
    if name in ("eig", "eigh"):
        return [(1, batch + (n,)), (m, batch + (m, n))]
    if name == "qr":  # Q and R, flattened side by side
        k = m if params.get("mode", "reduced") == "complete" else min(m, n)
        return [(m * k, batch + (m, k)), (k * n, batch + (k, n))]
    if name == "slogdet":  # the sign and the log of the magnitude, side by side
        return [(1, batch), (1, batch)]
    k = min(m, n)
    if not params.get("compute_uv", True):
        return [(k, batch + (k,))]
    u, vh = ((m, m), (n, n)) if params.get("full_matrices", True) else ((m, k), (k, n))
    return [(math.prod(u), batch + u), (k, batch + (k,)), (math.prod(vh), batch + vh)]


def packed_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """eig, eigh, svd, qr, slogdet: the packed result (``packed_parts``)."""
    shape = _shape(args[0])
    _square(op, shape)
    parts = packed_parts(op.name, shape, params)
    if op.name in ("svd", "qr", "slogdet"):
        return shape[:-2] + (sum(length for length, _ in parts),)
    return shape[:-2] + (shape[-2] + 1, shape[-1])


def lstsq_parts(a: Shape, b: Shape) -> list[tuple[int, Shape]]:
    """Where each result of ``lstsq`` of an (M, N) matrix and ``b`` lies in its packed op's
    result, as ``packed_parts`` says of the decompositions: the solution, the singular values
    and the rank, flattened side by side."""
    m, n = a
    solution = (n,) + b[1:]
    return [(math.prod(solution), solution), (min(m, n), (min(m, n),)), (1, ())]


def lstsq_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """lstsq(a, b): numpy's checks (one matrix; b of its rows, 1-d or 2-d); the packed
    result (``lstsq_parts``), or (until the device says) none of the residuals."""
    a, b = _shape(args[0]), _shape(args[1])
    for shape in (a, b if len(b) != 1 else (0, 0)):
        if len(shape) != 2:
            raise np.linalg.LinAlgError(f"{len(shape)}-dimensional array given. Array must "
                                        "be two-dimensional")
    if not b or b[0] != a[0]:
        raise np.linalg.LinAlgError("Incompatible dimensions")
    if op.name == "lstsq_residuals":
        return (0,)
    return (sum(length for length, _ in lstsq_parts(a, b)),)


def ones_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    """numpy's result dtype of a linear algebra op (or of ``average``), from its function on
    stand-ins of ones (one element per axis; zeros would be singular, or weights that sum to
    zero), or 0 where the real one is 0 for an op that checks empty axes first
    (``Op.empty_first``: average's 0/0 of an empty mean, its empty weights' zero sum). eig's
    may still turn real or complex with the data: the device says which
    (``fabric.core.ops.DATA_DEPENDENT_DTYPE``)."""
    stand_ins = [np.ones(small_shape(a.shape) if op.empty_first else (1,) * len(a.shape),
                         a.dtype) if hasattr(a, "dtype") and hasattr(a, "shape") else a
                 for a in args]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(op.impl(*stand_ins, **params)).dtype


def linalg(name: str) -> Callable[[Any], Callable[..., Any]]:
    """The build of ``np.linalg``'s function ``name`` over an array module: ``xp.linalg``'s."""
    return lambda xp: getattr(xp.linalg, name)


def _pack(xp: Any, parts: Sequence[Any], along_rows: bool) -> Any:
    dtype = xp.result_type(*parts)
    if along_rows:  # eigenvalues (..., n) as a first row above the vectors (..., m, n)
        return xp.concatenate([parts[0][..., None, :].astype(dtype), parts[1]], axis=-2)
    batch = parts[0].shape[:-2]
    return xp.concatenate([p.reshape(batch + (math.prod(p.shape[len(batch):]),)).astype(dtype)
                           for p in parts], axis=-1)  # (sizes named: a batch may be empty)


def decomposition(name: str) -> Callable[[Any], Callable[..., Any]]:
    """The build of decomposition ``name`` (eig, eigh, svd) over an array module: its
    function in ``xp.linalg``, its results packed (``packed_parts``). numpy's eig is real
    where every eigenvalue is (numpy's rule)."""
    def eig(xp: Any) -> Callable[..., Any]:
        return lambda a: _pack(xp, xp.linalg.eig(a), along_rows=True)

    def eigh(xp: Any) -> Callable[..., Any]:
        return lambda a, UPLO="L": _pack(xp, xp.linalg.eigh(a, UPLO=UPLO), along_rows=True)

    def svd(xp: Any) -> Callable[..., Any]:
        def run(a: Any, full_matrices: bool = True, compute_uv: bool = True,
                hermitian: bool = False) -> Any:
            """The singular values alone without ``compute_uv``."""
            result = xp.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv,
                                   hermitian=hermitian)
            return result if not compute_uv else _pack(xp, result, along_rows=False)
        return run
    return {"eig": eig, "eigh": eigh, "svd": svd}[name]


def pinv(xp: Any) -> Callable[..., Any]:
    """The build of np.linalg.pinv: its ``rtol`` a param (None: the array API's default,
    ``max(M, N)`` times epsilon, given to every module as a number) or, as a tensor, a
    second input."""
    def run(a: Any, *rtol: Any, hermitian: bool = False, **params: Any) -> Any:
        cut = rtol[0] if rtol else params.get("rtol")
        if cut is None:  # (numpy's: of an integer matrix, finfo's ValueError)
            cut = max(a.shape[-2:]) * float(np.finfo(a.dtype).eps)
        return xp.linalg.pinv(a, rtol=cut, hermitian=hermitian)
    return run


def qr(xp: Any) -> Callable[..., Any]:
    """The build of np.linalg.qr, packed (``packed_parts``)."""
    return lambda a, mode="reduced": _pack(xp, xp.linalg.qr(a, mode=mode), along_rows=False)


def slogdet(xp: Any) -> Callable[..., Any]:
    """The build of np.linalg.slogdet, packed: the sign and the log of the determinant's
    magnitude."""
    def run(a: Any) -> Any:
        sign, magnitude = xp.linalg.slogdet(a)
        return xp.stack([sign, magnitude.astype(sign.dtype)], axis=-1)
    return run


def cut_off(a: Any, rcond: float | None) -> float:
    """lstsq's cut-off: numpy's default where none is given (``max(M, N)`` times float64's
    epsilon: numpy computes in double precision), as a number for every module."""
    return max(a.shape) * float(np.finfo(np.float64).eps) if rcond is None else rcond


def lstsq(xp: Any) -> Callable[..., Any]:
    """The build of np.linalg.lstsq without its residuals, packed (``lstsq_parts``)."""
    def run(a: Any, b: Any, rcond: float | None = None) -> Any:
        solution, _, rank, values = xp.linalg.lstsq(a, b, rcond=cut_off(a, rcond))
        dtype = solution.dtype  # (the values are real and the rank an int: both fit it)
        return xp.concatenate([solution.reshape(-1), values.astype(dtype),
                               xp.asarray(rank).reshape(1).astype(dtype)])
    return run


def lstsq_residuals(a: np.ndarray, b: np.ndarray, rcond: float | None = None) -> np.ndarray:
    """np.linalg.lstsq's residuals: empty unless the rank is full and a has more rows than
    columns (their length depends on the data: the client asks the device)."""
    return np.linalg.lstsq(a, b, rcond=cut_off(a, rcond))[1]


# np.fft's transforms: those whose result is real (the others' is complex), and those whose
# last (or only) transformed axis is half the length of the other side's (plus one)
FFTS = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fftn", "ifftn", "rfftn", "irfftn")
_REAL_RESULT = ("irfft", "hfft", "irfftn")
_HALF_RESULT = ("rfft", "ihfft", "rfftn")


def fft(name: str) -> Callable[[Any], Callable[..., Any]]:
    """The build of np.fft's transform ``name``: ``xp.fft``'s (params as numpy takes them)."""
    return lambda xp: getattr(xp.fft, name)


def _fft_length(name: str, length: int, n: int | None) -> int:
    """The transformed axis's length: ``n`` points of the real or complex side (numpy's
    defaults without it), and numpy's error for fewer than one."""
    points = n if n is not None and n != -1 else (2 * (length - 1) if name in _REAL_RESULT
                                                  else length)
    if points < 1:
        raise ValueError(f"Invalid number of FFT data points ({points}) specified.")
    return points // 2 + 1 if name in _HALF_RESULT else points


def fft_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """np.fft's transforms: each transformed axis's new length (``_fft_length``)."""
    shape = list(_shape(args[0]))
    if not op.name.endswith("n"):
        axis = _axis_index(params.get("axis", -1), len(shape))
        shape[axis] = _fft_length(op.name, shape[axis], params.get("n"))
        return tuple(shape)
    sizes, axes = params.get("s"), params.get("axes")
    if axes is None:
        axes = list(range(-len(sizes), 0)) if sizes is not None else list(range(len(shape)))
    sizes = [None] * len(axes) if sizes is None else list(sizes)
    if len(sizes) != len(axes):
        raise ValueError("Shape and axes have different lengths.")
    for i, (axis, n) in enumerate(zip(axes, sizes)):
        axis = _axis_index(axis, len(shape))  # (only the last axis is the real one's)
        shape[axis] = _fft_length(op.name if i == len(axes) - 1 else "fftn", shape[axis], n)
    return tuple(shape)


def _axis_index(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


def fft_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    """np.fft's transforms keep the input's precision: complex64 or float32 from a 32-bit
    input, else complex128 or float64."""
    single = args[0].dtype in (np.float32, np.complex64)
    if op.name in _REAL_RESULT:
        return np.dtype(np.float32 if single else np.float64)
    return np.dtype(np.complex64 if single else np.complex128)


def pad_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """np.pad: each axis grows by its two widths (numpy's own checks ran in the dtype rule,
    on a stand-in)."""
    shape = _shape(args[0])
    widths = np.broadcast_to(np.asarray(params["pad_width"]), (len(shape), 2))
    return tuple(int(n + before + after) for n, (before, after) in zip(shape, widths.tolist()))


def pad(array: np.ndarray, pad_width: Any, mode: str = "constant", **kwargs: Any) -> np.ndarray:
    """np.pad."""
    return np.pad(array, pad_width, mode, **kwargs)


def bincount(x: np.ndarray, *weights: np.ndarray, minlength: int = 0) -> np.ndarray:
    """np.bincount (its length depends on the data: the client asks the device)."""
    return np.bincount(x, *weights, minlength=minlength)


def roll(a: np.ndarray, shift: Any, axis: Any = None) -> np.ndarray:
    """``np.roll``; its commonest form (an int shift along one int axis: a stencil's or Game of
    Life's neighbours) as two slice copies, at a third of ``np.roll``'s general cost."""
    a = np.asarray(a)
    if type(shift) is not int or type(axis) is not int or not -a.ndim <= axis < a.ndim:
        return np.roll(a, shift, axis)  # (numpy's errors too: AxisError)
    length = a.shape[axis]
    cut = shift % length if length else 0
    if cut == 0:
        return a.copy(order="K")  # (np.roll's copy, made as it makes it)
    out = np.empty_like(a)
    before = (slice(None),) * (axis % a.ndim)
    out[before + (slice(cut, None),)] = a[before + (slice(None, length - cut),)]
    out[before + (slice(None, cut),)] = a[before + (slice(length - cut, None),)]
    return out
