"""The op table's entries for numpy's statistics and signal functions: ``average``,
``histogram`` and its edges, ``interp``, ``convolve`` and ``lexsort``: their implementations
over an array module, and the shape rules ``fabric.core.ops`` lists them with (their dtypes
are numpy's own, found on stand-ins).

Rule: as ``fabric.core.ops_functions``'s: each op runs numpy's own function on the worker
(another array module's function of the same name on its devices), and its shape rule
restates only what numpy checks before computing, with numpy's error types and words: the
weights' shape, a histogram's bins, ``interp``'s sample points, ``convolve``'s lengths,
``lexsort``'s keys. What numpy checks on the values (weights that sum to zero, edges that do
not increase) fails on the device, at the next read.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.core.op_rules import Shape, reduce_shape


def _shape(arg: Any) -> Shape:
    # a tensor's (a Spec's) shape, or a scalar's ()
    return tuple(getattr(arg, "shape", ()))


def average(xp: Any) -> Callable[..., Any]:
    """The build of np.average: its weights, where given, a second input."""
    def run(a: Any, *weights: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return xp.average(a, axis=axis, weights=weights[0] if weights else None,
                          keepdims=keepdims)
    return run


def average_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """average: numpy's checks of the weights (of the array's shape, or of its lengths along
    the axes averaged), then the shape of the mean over those axes."""
    a = _shape(args[0])
    if len(args) > 1 and _shape(args[1]) != a:
        if params.get("axis") is None:
            raise TypeError("Axis must be specified when shapes of a and weights differ.")
        axes = normalize_axis_tuple(params["axis"], len(a))
        if _shape(args[1]) != tuple(a[axis] for axis in axes):
            raise ValueError("Shape of weights must be consistent with shape of a along "
                             "specified axis.")
    return reduce_shape(op, args[:1], params)


def histogram(part: str) -> Callable[[Any], Callable[..., Any]]:
    """The build of np.histogram's counts (``part`` 'histogram') or of
    np.histogram_bin_edges: the bins a count (the param ``bins``) or edges (the second
    input), the weights the last input where ``weighted``."""
    def build(xp: Any) -> Callable[..., Any]:
        function = getattr(xp, part)

        def run(a: Any, *given: Any, bins: int | None = None, weighted: bool = False,
                **params: Any) -> Any:
            found = function(a, given[0] if bins is None else bins,
                             weights=given[-1] if weighted else None, **params)
            return found[0] if part == "histogram" else found
        return run
    return build


def histogram_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """histogram's counts, one per bin, and its edges, one more: numpy's checks of the
    weights' shape (the bins' own ran in the dtype rule, on stand-ins)."""
    bins = params.get("bins")
    count = max(_shape(args[1])[0] - 1, 0) if bins is None else bins
    if params.get("weighted") and _shape(args[-1]) != _shape(args[0]):
        raise ValueError("weights should have the same shape as a.")
    return (count + 1,) if op.name == "histogram_bin_edges" else (count,)


def interp(xp: Any) -> Callable[..., Any]:
    """The build of np.interp (``left``, ``right`` and ``period`` its params)."""
    return lambda x, points, values, **params: xp.interp(x, points, values, **params)


def interp_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """interp: one value per point of ``x``, from 1-d sample points and values of one
    length (numpy's checks)."""
    points, values = _shape(args[1]), _shape(args[2])
    if len(points) > 1 or len(values) > 1:
        raise ValueError("object too deep for desired array")
    if points != values:
        raise ValueError("fp and xp are not of the same length.")
    if not points or not points[0]:
        raise ValueError("array of sample points is empty")
    return _shape(args[0])


def convolve(xp: Any) -> Callable[..., Any]:
    """The build of np.convolve (``mode`` its param)."""
    return lambda a, v, mode="full": xp.convolve(a, v, mode=mode)


def convolve_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """convolve: numpy's checks of two sequences (a scalar is one of length 1), and the
    length of the mode's result (the mode's own check ran in the dtype rule)."""
    lengths = []
    for name, arg in zip("av", args):
        shape = _shape(arg) or (1,)
        if len(shape) > 1:
            raise ValueError("object too deep for desired array")
        if not shape[0]:
            raise ValueError(f"{name} cannot be empty")
        lengths.append(shape[0])
    longer, shorter = max(lengths), min(lengths)
    return ({"full": longer + shorter - 1, "same": longer,
             "valid": longer - shorter + 1}[params.get("mode", "full")],)


def lexsort(xp: Any) -> Callable[..., Any]:
    """The build of np.lexsort: each key an input, the last the primary one."""
    return lambda *keys, axis=-1: xp.lexsort(keys, axis=axis)


def lexsort_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """lexsort: keys of one shape, and an axis of it (numpy's checks); an index per
    element."""
    if not args:
        raise TypeError("need sequence of keys with len > 0 in lexsort")
    shape = _shape(args[0])
    if any(_shape(key) != shape for key in args[1:]):
        raise ValueError("all keys need to be the same shape")
    if shape:
        normalize_axis_index(params.get("axis", -1), len(shape))
    return shape
