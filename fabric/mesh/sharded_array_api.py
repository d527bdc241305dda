"""The array API standard's namespace of a mesh (``x.__array_namespace__()`` of a sharded
tensor), with which libraries written against the standard (scikit-learn's
``array_api_dispatch``, array-api-extra) compute on every device of the mesh unchanged.

Rule: each function is the one-device namespace's (``fabric.array_api``), run where it needs
no data from another device, so its dtypes and special cases are that namespace's:
elementwise functions on each shard of operands split alike (or replicated, or scalars:
``sharded.elementwise``), and sorts, scans, flips and differences along other axes than the
split one; the reductions, cumulative sums, ``astype``, ``permute_dims`` and
``vector_norm`` by the sharded tensor's own methods, which combine across the split axis
where they can (``fabric.mesh.reductions``); ``matmul`` and ``tensordot`` in the layouts ``@``
takes, and ``linalg.svd`` of a tall matrix split along its rows by each device's QR
(``sharded_linalg``); creation whole on each device (replicated), a ``*_like`` split as its
model; and any function of replicated tensors on each device's copy. Along the split axis,
scans carry from block to block, and sorts and ``concat`` move the data worker to worker
(``sharded_across``); elementwise functions, ``reshape``, ``astype`` and ``asarray`` of results
combined from partials that no device holds yet wait for their read (``combining``);
``nonzero`` and the set functions run on each block, the set functions' small results merged
on the client (``sharded_selection``); ``stack`` of tensors split alike and ``squeeze`` of other
axes on each shard. Anything else of a split tensor is refused with the move after which it
runs. A sharded tensor's
``device`` is its mesh.
"""

from __future__ import annotations

import builtins
import inspect
import math
import operator
from typing import Any, Callable

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.array_api import dtypes, linalg
from fabric.array_api.elementwise import BINARY, UNARY
from fabric.array_api.elementwise import FUNCTIONS as ELEMENTWISE
from fabric.array_api.fft import FUNCTIONS as TRANSFORMS
from fabric.array_api.functions import FUNCTIONS as OTHERS
from fabric.array_api.namespace import (API_VERSION, API_VERSIONS, ArrayAPINamespace, Info,
                                        namespace)
from fabric.arrays.tensor import Tensor
from fabric.mesh import combining
from fabric.mesh.sharded_across import across
from fabric.mesh.sharded import _RESHARD, FUNCTIONS, Mesh, ShardedTensor, elementwise, \
    mesh_operands
from fabric.mesh.sharded_linalg import SVDResult, tall_svd, tensordot
from fabric.mesh.sharded_selection import SET_FUNCTIONS, nonzero, unique

# The creation functions of a one-device namespace (its methods), and those that make a
# tensor split as their first argument is (a tensor's copy, or of its shape)
CREATION = ("asarray", "from_dlpack", "zeros", "ones", "empty", "full", "zeros_like",
            "ones_like", "empty_like", "full_like", "arange", "linspace", "eye", "meshgrid",
            "tril", "triu")
LIKE = frozenset({"asarray", "zeros_like", "ones_like", "empty_like", "full_like"})
# Functions of one tensor along ``axis`` that keep its dimensions: on each shard, split as it
# is, where ``axis`` (None: every one) leaves out the split axis
ALONG = frozenset({"sort", "argsort", "flip", "roll", "diff", "cumulative_sum",
                   "cumulative_prod"})
# Functions that run along the split axis too (``fabric.mesh.sharded_across``)
ACROSS = frozenset({"concat", "sort", "argsort", "cumulative_sum", "cumulative_prod"})
# Functions of one device made of a tensor's methods and numpy's functions only, which a
# sharded tensor has (each combining across the split axis, or refusing, as it can)
OWN = frozenset({"sum", "prod", "mean", "max", "min", "std", "var", "all", "any", "argmax",
                 "argmin", "count_nonzero", "cumulative_sum", "cumulative_prod", "astype",
                 "permute_dims", "vector_norm"})


def _matrix_transpose(x: ShardedTensor, /) -> ShardedTensor:
    if x.ndim < 2:
        raise ValueError("matrix_transpose takes a tensor of at least 2 dimensions.")
    return x.transpose((*range(x.ndim - 2), x.ndim - 1, x.ndim - 2))


def _svd(x: ShardedTensor, /, *, full_matrices: builtins.bool = True) -> SVDResult:
    if full_matrices or x.ndim != 2 or x.axis != 0:
        raise ValueError(f"linalg.svd of {x._handle()} runs across devices only for a matrix "
                         "split along its rows, with full_matrices=False (each device's QR, "
                         "the R factors combined): put its whole on each device first "
                         "(mesh.replicate(x), worker to worker) for the others.")
    return tall_svd(x)


def _reshape(x: ShardedTensor, /, shape: tuple[int, ...], *,
             copy: builtins.bool | None = None) -> ShardedTensor:
    """``x`` in a new shape, on each shard, where the split axis stays one axis of the
    result with what lies before it and after it the same sizes (``(n,)`` to ``(n, 1)``)."""
    shape = tuple(operator.index(n) for n in shape)
    if shape.count(-1) == 1:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple((x.size // known if known else 0) if n == -1 else n for n in shape)
    if math.prod(shape) != x.size or any(n < 0 for n in shape):
        raise ValueError(f"cannot reshape array of size {x.size} into shape {shape}")
    axis, before = x.axis, math.prod(x.shape[:x.axis])
    kept = next((k for k in range(len(shape)) if math.prod(shape[:k]) == before
                 and shape[k] == x.shape[axis]), None)
    if kept is None:
        raise TypeError(f"xp.reshape of {x._handle()} to {shape} would mix rows of different "
                        f"devices: {_RESHARD}.")
    return x._on_each(lambda t: OTHERS["reshape"](t, shape[:kept] + (t.shape[axis],) + shape[
        kept + 1:], copy=copy), kept)


def _expand_dims(x: ShardedTensor, /, axis: int = 0) -> ShardedTensor:
    """``x`` with a new axis of length one at ``axis``, on each shard."""
    at = normalize_axis_index(operator.index(axis), x.ndim + 1)
    return x._on_each(lambda t: OTHERS["expand_dims"](t, axis=at),
                      x.axis + (at <= x.axis))


def _broadcast_to(x: ShardedTensor, /, shape: tuple[int, ...]) -> ShardedTensor:
    """``x`` broadcast to ``shape``, on each shard, where its split axis is not stretched."""
    shape = tuple(shape)
    at = x.axis + len(shape) - x.ndim
    if np.broadcast_shapes(x.shape, shape) != shape or at < 0 or shape[at] != x.shape[x.axis]:
        np.broadcast_to(np.broadcast_to(np.zeros((), x.dtype), x.shape), shape)  # numpy's error
        raise TypeError(f"xp.broadcast_to of {x._handle()} to {shape} would stretch its split "
                        f"axis: {_RESHARD}.")
    return x._on_each(lambda t: OTHERS["broadcast_to"](
        t, shape[:at] + (t.shape[x.axis],) + shape[at + 1:]), at)


def _squeeze(x: ShardedTensor, /, axis: int | tuple[int, ...]) -> ShardedTensor:
    """``x`` without the axes ``axis`` (each of length one), on each shard: not the split
    axis."""
    axes = normalize_axis_tuple(axis, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    if x.axis in axes:
        raise TypeError(f"xp.squeeze of {x._handle()} along its split axis: {_RESHARD}.")
    return x._on_each(lambda t: OTHERS["squeeze"](t, axis=axes),
                      x.axis - sum(a < x.axis for a in axes))


def _stack(arrays: Any, /, *, axis: int = 0) -> ShardedTensor:
    """The tensors, split alike, stacked along a new ``axis`` on each shard."""
    mesh, arrays = mesh_operands(arrays)
    first = arrays[0]
    if any(not isinstance(a, ShardedTensor) or a.axis != first.axis
           or a.sharding.blocks != first.sharding.blocks for a in arrays):
        raise TypeError(f"xp.stack of {first._handle()} takes tensors split alike: reshard "
                        "them alike first (x.reshard(axis=...)).")
    if any(a.shape != first.shape for a in arrays):
        raise ValueError("all input arrays must have the same shape")
    at = normalize_axis_index(operator.index(axis), first.ndim + 1)
    return ShardedTensor(mesh, [OTHERS["stack"](list(parts), axis=at) for parts in zip(
        *[a._tensors() for a in arrays])], first.axis + (at <= first.axis))


def _broadcast_arrays(*arrays: Any) -> tuple[Any, ...]:
    """The arrays broadcast against each other, each split one on each shard."""
    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    return tuple(a if a.shape == shape else _broadcast_to(a, shape) if a.axis is not None
                 else a.__array_namespace__().broadcast_to(a, shape) for a in arrays)


# How split operands run, other than by the one-device function (extension, name)
# The standard's elementwise functions that are numpy's ufunc alone: their name -> numpy's
NUMPY_UFUNCS = {**UNARY, **BINARY}
SPLIT: dict[tuple[str, str], Callable[..., Any]] = {
    **{(extension, "matmul"): lambda x1, x2, /: FUNCTIONS[np.matmul](x1, x2)
       for extension in ("", "linalg")},
    **{(extension, "tensordot"): lambda x1, x2, /, *, axes=2: tensordot(x1, x2, axes)
       for extension in ("", "linalg")},
    **{(extension, "matrix_transpose"): _matrix_transpose for extension in ("", "linalg")},
    ("linalg", "svd"): _svd, ("", "reshape"): _reshape, ("", "expand_dims"): _expand_dims,
    ("", "broadcast_to"): _broadcast_to, ("", "broadcast_arrays"): _broadcast_arrays,
    ("", "stack"): _stack, ("", "squeeze"): _squeeze,
}


def _at(value: Any, i: int) -> Any:
    """``value`` (an argument: a tensor, a list or tuple of them, anything else) as device
    ``i`` holds it: a sharded tensor's shard there."""
    if isinstance(value, ShardedTensor):
        return value._tensors()[i]
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_at(item, i) for item in value)
    return value


def _tensors_in(values: Any) -> list[Tensor]:
    found = []
    for value in values:
        if isinstance(value, Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors_in(value))
    return found


def _joined(mesh: Mesh, results: list[Any], axis: int | None) -> Any:
    """Each device's results of one function as the mesh's: tensors as a sharded tensor
    (split along ``axis``, or replicated), tuples item by item, anything else the first
    device's (a dtype, a Python scalar: the same on each)."""
    first = results[0]
    if isinstance(first, Tensor):
        return ShardedTensor(mesh, list(results), axis)
    if isinstance(first, (tuple, list)):
        items = [_joined(mesh, [r[k] for r in results], axis) for k in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    return first


class ShardedNamespace:
    """The array API standard's namespace (2025.12) of a mesh: ``x.__array_namespace__()`` of
    a sharded tensor. Its functions run on the mesh's devices as the one-device namespace's
    do on one (``fabric.array_api``); creation makes tensors whole on each device."""

    __name__ = "fabric.array_api"
    __array_api_version__ = API_VERSION

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._per_device = [namespace(session) for session in mesh.sessions]
        self.linalg = _Extension(self, "linalg", linalg.__all__)
        self.fft = _Extension(self, "fft", [*TRANSFORMS, "fftfreq", "rfftfreq"])

    def __eq__(self, other: object) -> builtins.bool:
        return type(other) is ShardedNamespace and other.mesh is self.mesh

    def __hash__(self) -> int:
        return hash((ShardedNamespace, id(self.mesh)))

    def __repr__(self) -> str:
        return f"<fabric.array_api namespace of {self.mesh!r}>"

    def __array_namespace_info__(self) -> "MeshInfo":
        """The namespace's capabilities, its one device (the mesh) and dtypes."""
        return MeshInfo(self._per_device[0], self.mesh)

    def run(self, extension: str, name: str, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        """Function ``name`` (of ``extension``: "", "linalg" or "fft") of ``args`` on the
        mesh's devices, by the module's rule."""
        if kwargs.get("device") is not None:
            if kwargs["device"] is not self.mesh:
                raise ValueError(f"device= takes this namespace's mesh (x.device), not "
                                 f"{kwargs['device']!r}: a sharded tensor's namespace makes "
                                 "tensors on every device of its mesh.")
            kwargs = {**kwargs, "device": None}
        tensors = _tensors_in((*args, *kwargs.values()))
        if tensors:
            mesh, _ = mesh_operands(tensors)  # (a tensor of one device, or of another mesh)
            if mesh is not self.mesh:
                raise ValueError(f"{tensors[0]._handle()} lives on another mesh than this "
                                 "namespace's: make both on one mesh (mesh.asarray(...)).")
        split = [t for t in tensors if t.axis is not None]
        pending = self._on_the_client(extension, name, args, kwargs)
        if pending is not None:
            return pending
        if not extension and (name in ELEMENTWISE or name == "where"):
            if not tensors:
                raise TypeError(f"xp.{name} takes a fabric tensor: make one with xp.asarray.")
            keys, count = list(kwargs), len(args)
            function = ELEMENTWISE.get(name) or OTHERS[name]
            return elementwise(lambda *each: function(*each[:count], **dict(
                zip(keys, each[count:]))), (*args, *kwargs.values()))
        if not split or name in LIKE:
            made = self._each_shard(name, args, kwargs, split[0].axis if split else None,
                                    extension)
            if name == "asarray" and split and made.dtype == split[0].dtype:  # (a copy)
                combining.same_values(made._tensors(), split[0]._tensors())
            return made
        if (extension, name) in SPLIT:
            return SPLIT[extension, name](*args, **kwargs)
        if not extension and name in ALONG and self._along_others(name, args, kwargs):
            return self._each_shard(name, args, kwargs, split[0].axis)
        if not extension and name in ACROSS:
            found = across(name, args, kwargs)
            if found is not None:
                return found
        if not extension and name in SET_FUNCTIONS and len(args) == 1 and not kwargs:
            return unique(name, args[0])
        if not extension and name == "nonzero" and len(args) == 1 and not kwargs:
            return nonzero(args[0])
        if name in OWN:
            source = getattr(linalg, name) if extension == "linalg" else OTHERS[name]
            return source(*args, **kwargs)
        where = f"xp.{extension}.{name}" if extension else f"xp.{name}"
        raise TypeError(f"{where} of {split[0]._handle()} needs data from other devices: "
                        f"{_RESHARD}.")


    def _on_the_client(self, extension: str, name: str, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> ShardedTensor | None:
        """Function ``name`` of results combined from every device's partials that no device
        holds yet (``fabric.mesh.combining``), composed with their combine when they are read:
        an elementwise function of such tensors alone (the standard's promotion is numpy's
        between arrays), a reshape or ``astype`` of one, or ``asarray`` of one (itself, as
        the standard allows); None for any other call."""
        if extension or not args or not combining.is_pending(args[0]):
            return None
        if name in NUMPY_UFUNCS and not kwargs and all(combining.is_pending(a) for a in args):
            return ShardedTensor.combined(self.mesh, *combining.composed(
                getattr(np, NUMPY_UFUNCS[name]), args))
        if name == "asarray" and len(args) == 1 and kwargs.get("copy") is not True and \
                kwargs.get("dtype") in (None, args[0].dtype):
            return args[0]
        if name == "reshape" and len(args) == 2 and kwargs.get("copy") is not False:
            x, shape = args
            new = np.reshape(np.broadcast_to(np.empty((), x.dtype), x.shape), shape).shape
            return ShardedTensor.combined(self.mesh, *combining.composed(
                lambda value: np.reshape(value, new), [x], result=(new, x.dtype)))
        if name == "astype" and len(args) == 2 and set(kwargs) <= {"copy"}:
            x, dtype = args
            if dtype == x.dtype and kwargs.get("copy") is False:
                return x
            if not (x.dtype.kind == "c" and np.dtype(dtype).kind != "c"):  # (refused so)
                return ShardedTensor.combined(self.mesh, *combining.composed(
                    lambda value: value.astype(dtype), [x], result=(x.shape, np.dtype(dtype))))
        return None

    def _each_shard(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    axis: int | None, extension: str = "") -> Any:
        """The one-device function on each device's shards, its results split along
        ``axis`` (None: replicated)."""
        return _joined(self.mesh, [
            getattr(getattr(xp, extension) if extension else xp, name)(
                *_at(args, i), **{key: _at(value, i) for key, value in kwargs.items()})
            for i, xp in enumerate(self._per_device)], axis)

    def _along_others(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether function ``name`` of one split tensor works along axes other than its
        split one (``axis`` as given, or the function's default)."""
        x = args[0] if args else kwargs.get("x")
        if not isinstance(x, ShardedTensor) or len(_tensors_in((*args, *kwargs.values()))) > 1:
            return False
        signature = inspect.signature(getattr(self._per_device[0], name))
        axis = signature.bind(*args, **kwargs).arguments.get(
            "axis", signature.parameters["axis"].default)
        if axis is None:
            return False
        return x.axis not in normalize_axis_tuple(axis, x.ndim)


class _Extension:
    """An extension of a mesh's namespace (``xp.linalg``, ``xp.fft``), by the same rule."""

    def __init__(self, owner: ShardedNamespace, name: str, functions: list[str]) -> None:
        for function in functions:
            setattr(self, function, _method(owner, name, function))


def _method(owner: ShardedNamespace, extension: str, name: str) -> Callable[..., Any]:
    def function(*args: Any, **kwargs: Any) -> Any:
        return owner.run(extension, name, args, kwargs)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"The standard's ``{name}`` on the mesh's devices."
    function.__signature__ = inspect.signature(  # type: ignore[attr-defined]
        getattr(getattr(owner._per_device[0], extension), name))  # (the standard's, as one's)
    return function


class MeshInfo(Info):
    """``xp.__array_namespace_info__()`` of a mesh's namespace: its device is the mesh."""

    def __init__(self, one: Any, mesh: Mesh) -> None:
        super().__init__(one)
        self._mesh = mesh

    def default_device(self) -> Mesh:
        """The mesh: creation makes a tensor whole on each of its devices."""
        return self._mesh

    def devices(self) -> tuple[Mesh]:
        """The mesh, the one device of its namespace."""
        return (self._mesh,)


def _bound(name: str) -> Callable[..., Any]:
    def method(self: ShardedNamespace, *args: Any, **kwargs: Any) -> Any:
        return self.run("", name, args, kwargs)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"The standard's ``{name}`` on the mesh's devices."
    one = inspect.signature(getattr(ArrayAPINamespace(None), name))  # (the standard's)
    method.__signature__ = one.replace(parameters=[  # type: ignore[attr-defined]
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *one.parameters.values()])
    return method


for _name in (*ELEMENTWISE, *OTHERS, *CREATION):
    setattr(ShardedNamespace, _name, _bound(_name))
for _name in ("isdtype", "result_type", "can_cast", "finfo", "iinfo"):
    setattr(ShardedNamespace, _name, staticmethod(getattr(dtypes, _name)))
for _name, _value in {**dtypes.DTYPES, "e": dtypes.e, "inf": dtypes.inf, "nan": dtypes.nan,
                      "pi": dtypes.pi, "newaxis": dtypes.newaxis}.items():
    setattr(ShardedNamespace, _name, _value)


# -- the standard's members of a sharded tensor ------------------------------------------------

def _array_namespace(self: ShardedTensor, /, *,
                     api_version: str | None = None) -> ShardedNamespace:
    """The array API standard's namespace of this tensor's mesh: its functions run on each
    device (``fabric.mesh.sharded_array_api``)."""
    if api_version is not None and api_version not in API_VERSIONS:
        raise ValueError(f"fabric.array_api serves the array API standard's revisions "
                         f"{', '.join(API_VERSIONS)}, not {api_version!r}: ask for one of "
                         "them, or None.")
    return ShardedNamespace(self.mesh)


def _to_device(self: ShardedTensor, device: Any, /, *, stream: Any = None) -> Any:
    """This array on ``device``: its mesh (itself), or ``"cpu"``: read back, the explicit
    read it is."""
    if isinstance(device, str) and device == "cpu":
        return self.numpy()
    if device is self.mesh and stream is None:
        return self
    raise ValueError(f"{self._handle()} moves to 'cpu' (a read) or stays on its mesh: for "
                     "one device's whole copy, reshard it (x.reshard(axis=None).shards[0][1]).")


ShardedTensor.__array_namespace__ = _array_namespace  # type: ignore[method-assign]
ShardedTensor.to_device = _to_device  # type: ignore[method-assign]
ShardedTensor.device = property(  # type: ignore[assignment]
    lambda self: self.mesh, doc="The mesh the tensor lies on (its namespace's device).")
ShardedTensor.mT = property(  # type: ignore[assignment]
    _matrix_transpose, doc="Each matrix transposed (the last two axes swapped), on each shard.")
