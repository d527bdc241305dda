"""Views and updates of tensors: how a write reaches a tensor, the tensor it is a view of,
and its views.

Rule: a device's arrays never change. An update (``t[i] = v``, ``t += v``, ``out=t``,
``np.add.at(t, ...)``) computes a new array (copy on write) and moves the tensor's handle to
it (``assign``). A view (``t[0]``, ``t.T``, ...) is linked to its base (``link``), so that a
write through either reaches the other as numpy's does: a write through a view is put back
into its base in the base's layout (``_UNDO_VIEW``), and every live view of the base is then
made again from the new values. Where numpy's result depends on memory layout (a reshape and
its base while both are in use) or numpy refuses (``broadcast_to``), the write is refused
before anything is sent (``check_writable``), with a sentence that says what to write
instead. Every function here takes tensors already checked to be tensors by the caller
(``fabric.arrays.tensor``), so this module never imports the ``Tensor`` class.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, NamedTuple

import numpy as np

from fabric.arrays.origins import issued_at
from fabric.core.ops import REDUCTIONS, Spec


class ViewLink(NamedTuple):
    """How a view was made from its base: op ``name`` on ``(base, *args)`` with ``params``
    (as they travel), and ``kind``: "view" (numpy always shares memory: a write through it
    reaches the base), "read-only" (``broadcast_to``: numpy refuses writes through it) or
    "layout" (``reshape``: numpy shares memory only where the layout allows, so a write
    through it, or into its base while it lives, is refused). A view holds its base, as
    numpy's does (a view of a temporary view still reaches the array); a reshape holds it
    weakly, so that the reshape of a tensor nobody holds is free to change."""

    held: Any  # the base, or for "layout" a weak reference to it
    name: str
    args: tuple[Any, ...]
    params: dict[str, Any]
    kind: str

    @property
    def base(self) -> Any:
        """The tensor this view was made from; None once a reshape's base is let go."""
        return self.held() if self.kind == "layout" else self.held


_new_tuple = tuple.__new__  # (a NamedTuple without its Python __new__: one per view)
_VIEWS_COUNTED_FROM = 16  # a base's view registry is first pruned at this length

_LAYOUT_DEPENDENT = (
    "Cannot write into {which} as numpy writes into a reshape and its base only where no "
    "copy was needed, which depends on memory layout: write into the tensor in its own shape "
    "and reshape it again afterwards, or take .copy() of the reshape (or let it go) first.")

# How a write through a view reaches its base: the view's new values, put back in the
# base's layout (getitem's is a setitem with the view's own index).
_UNDO_VIEW = {
    "transpose": lambda values, link, base: values.session.apply(
        "transpose", (values,), {"axes": None if link.params["axes"] is None else tuple(
            np.argsort([axis % values.ndim for axis in link.params["axes"]]).tolist())}),
    "swapaxes": lambda values, link, base: values.session.apply(
        "swapaxes", (values,), link.params),
    "expand_dims": lambda values, link, base: values.session.apply(
        "reshape", (values,), {"shape": base.shape}),
    "squeeze": lambda values, link, base: values.session.apply(
        "reshape", (values,), {"shape": base.shape}),
    "getitem": lambda values, link, base: base.session.emit(
        "setitem", (base, values, *link.args), base.shape, base.dtype, link.params,
        issued_at()),
}


class _ViewRefs(list):  # type: ignore[type-arg]
    # A base's views, as weak references without callbacks (a WeakSet's add and removal
    # cost a stencil's every operand a fifth of its time); the dead ones are dropped once
    # there are as many again as there were live ones at the last count.
    __slots__ = ("bound",)


def link(base: Any, view: Any, name: str, args: tuple[Any, ...], params: dict[str, Any],
         kind: str) -> Any:
    """``view``, made from tensor ``base`` by op ``name`` (``ViewLink``'s fields), linked to
    it so that updates reach both as numpy's do; returned."""
    view._view_of = _new_tuple(ViewLink, (
        weakref.ref(base) if kind == "layout" else base, name, args, params, kind))
    refs = getattr(base, "_views", None)
    if refs is None:
        refs = base._views = _ViewRefs()
        refs.bound = _VIEWS_COUNTED_FROM
    refs.append(weakref.ref(view))
    if len(refs) >= refs.bound:
        _live_views(base)
    return view


def _live_views(tensor: Any) -> list[Any]:
    # The views of ``tensor`` still in use (its registry keeps only theirs)
    refs = getattr(tensor, "_views", None)
    if not refs:
        return []
    live = [view for view in (ref() for ref in refs) if view is not None]
    if len(live) < len(refs):
        refs[:] = [weakref.ref(view) for view in live]
    refs.bound = 2 * len(live) + _VIEWS_COUNTED_FROM
    return live


def check_writable(tensor: Any) -> None:
    """Raise, before anything is sent, where an update of ``tensor`` may not run: inside a
    traced function, through a read-only view, or where numpy's result would depend on the
    memory layout (a reshape of a tensor, while both are in use)."""
    tensor.session.check_update()
    root, view_link = tensor, getattr(tensor, "_view_of", None)
    while view_link is not None and view_link.base is not None:
        if view_link.kind == "read-only":
            raise ValueError("assignment destination is read-only (a broadcast_to view, "
                             "as numpy's): write into the tensor it was made from, or "
                             "take .copy() of it first.")
        if view_link.kind == "layout":
            raise ValueError(_LAYOUT_DEPENDENT.format(
                which="this tensor, a reshape of another tensor still in use,"))
        root = view_link.base
        view_link = getattr(root, "_view_of", None)
    pending = [root]
    while pending:
        for view in _live_views(pending.pop()):
            if view._view_of.kind == "layout" and view is not tensor:
                raise ValueError(_LAYOUT_DEPENDENT.format(
                    which=f"a reshape of this tensor (shape {view.shape}), still in use,"))
            pending.append(view)


def assign(tensor: Any, values: Any) -> None:
    """``tensor`` now holds ``values`` (a new tensor of its shape and dtype, which it takes
    over): written back into the tensor it is a view of, and seen by its views."""
    view_link = getattr(tensor, "_view_of", None)
    base = None if view_link is None else view_link.base
    if base is not None:
        assign(base, _UNDO_VIEW[view_link.name](values, view_link, base))  # (tensor included)
        return
    _take(tensor, values)
    _refresh_views(tensor)


def _take(tensor: Any, values: Any) -> None:
    # The handle moves to values' array, and the old one is freed at this point of the
    # stream (values' own handle is let go without freeing it).
    stream = tensor.session.stream
    old, tensor.id = tensor.id, values.id
    del values.session
    stream.batch.append(old)
    stream.freed.append(old)


def _refresh_views(tensor: Any) -> None:
    # Each live view is made again from the new values (a view op: no copy on the device)
    for view in _live_views(tensor):
        view_link = view._view_of
        _take(view, tensor.session.emit(view_link.name, (tensor, *view_link.args), view.shape,
                                        view.dtype, view_link.params, issued_at()))
        _refresh_views(view)


def check_out(ufunc: np.ufunc, inputs: tuple[Any, ...], out: tuple[Any, ...]) -> None:
    """Raise numpy's error, before anything is sent, where ``ufunc(*inputs, out=out)`` may
    not store into ``out`` (tensors of the inputs' session, checked by the caller): an
    update refused (``check_writable``), a dtype 'same_kind' casting refuses (numpy's own
    error, from the ufunc on stand-ins of one element), or a shape the inputs do not
    broadcast to."""
    for target in out:
        check_writable(target)

    def tiny(a: Any) -> Any:
        return np.zeros((1,) * len(a.shape), a.dtype) if isinstance(a, Spec) else a
    with np.errstate(all="ignore"):
        ufunc(*map(tiny, inputs), out=tuple(map(tiny, out)))
    if ufunc.signature is None:  # elementwise: the inputs broadcast to out's shape (a
        # gufunc's result, np.matmul's, is checked when it is known: store_into)
        for target in out:
            _check_broadcast([a.shape for a in inputs if isinstance(a, Spec)], target)


def _check_broadcast(shapes: list[tuple[int, ...]], target: Any) -> None:
    shape = np.broadcast_shapes(*shapes, target.shape)
    if shape != target.shape:
        raise ValueError(f"non-broadcastable output operand with shape {target.shape} "
                         f"doesn't match the broadcast shape {shape}")


def store_into(target: Any, result: Any) -> Any:
    """Tensor ``result`` stored into tensor ``target``, as numpy's out= does (checked by
    ``check_out``): broadcast to its shape and cast to its dtype. Returns ``target``."""
    _check_broadcast([result.shape], target)
    values = result if result.dtype == target.dtype else result.astype(target.dtype)
    if values.shape != target.shape:
        values = target.session.apply("broadcast_to", (values,), {"shape": target.shape})
    assign(target, values)
    return target


def check_reduction_out(name: str, a: Any, params: dict[str, Any], shape: tuple[int, ...],
                        out: Any) -> None:
    """Raise, before anything is sent, where reduction ``name`` of tensor ``a`` (its wire
    ``params``, its result's ``shape``) may not store into ``out``: not a tensor of ``a``'s
    session, an update refused (``check_writable``), another shape (numpy's ValueError), or
    a dtype numpy's reduction will not cast to (numpy's own error, from the reduction on
    stand-ins of one element)."""
    if not isinstance(out, Spec) or getattr(out, "session", None) is not a.session:
        raise TypeError(f"numpy.{name}'s out= must be a tensor of the same session as its "
                        "input (a numpy array cannot take a device's result: read it instead).")
    check_writable(out)
    if out.shape != shape:
        raise ValueError(f"output parameter for reduction operation {name} has shape "
                         f"{out.shape}, but the result's is {shape}")
    reduce = REDUCTIONS[name]
    tiny = np.zeros((1,) * len(a.shape), a.dtype)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (one element warns where real data may not: ddof)
        reduce(tiny, **params, out=np.zeros(np.shape(reduce(tiny, **params)), out.dtype))


def ufunc_at(ufunc: np.ufunc, target: Any, indices: Any, *values: Any) -> None:
    """``np.add.at(target, indices, values)`` (any ufunc of the table) on tensor
    ``target``: unbuffered, so repeated indices each count, as numpy's; one op."""
    if len(values) != ufunc.nin - 1:
        raise TypeError(f"numpy.{ufunc.__name__}.at takes {ufunc.nin - 1} operand(s) after "
                        "the indices")
    check_writable(target)
    assign(target, target._indexed("ufunc_at", values, indices, in_place=True,
                                   ufunc=ufunc.__name__)[0])


def shares_values(tensor: Any) -> bool:
    """Whether another tensor in use sees ``tensor``'s device memory: a view of it, or the
    tensor it is a view of."""
    return root(tensor) is not tensor or bool(_live_views(tensor))


def root(tensor: Any) -> Any:
    """The tensor whose device memory ``tensor``, a view of views, shares in numpy (itself
    when it is no view, or a reshape whose base is gone)."""
    view_link = getattr(tensor, "_view_of", None)
    while view_link is not None and view_link.base is not None:
        tensor = view_link.base
        view_link = getattr(tensor, "_view_of", None)
    return tensor
