"""The elementwise operators of tensors (``a + b``, ``-t``, ``np.exp(t)``): the short way
from the user's call to a queued op, the commonest call in user code.

Rule: an operator is the function the user's call runs (``Tensor.__add__`` is a ``pair``),
and does nothing it can learn once: a result's dtype is remembered per kind of operands, its
shape is its tensor operand's, and its op goes straight into the stream in the wire's compact
form (``OpStream.push``). Every other call goes the long way, ``session.apply``'s inference.
``fabric.arrays.tensor`` gives these functions its ``Tensor`` class (``tensor_type``).
"""

from __future__ import annotations

from sys import _getframe
from typing import Any, Callable

import numpy as np

from fabric.arrays.origins import LAST_ORIGIN, issued_at
from fabric.core.ops import NO_PARAMS, OPS, Spec, weak_int
from fabric.core.wire import INT_RANGE, encode_scalar


def elementwise_pair(name: str, tensor_type: type[Spec]) -> Callable[..., Any]:
    """Elementwise op ``name`` on two operands, a tensor among them (``+``, ``<``,
    ``np.maximum``, ...): the commonest call in user code. The function is the operator
    itself (``Tensor.__add__``), so no frame stands between the user's ``a + b`` and the op
    (one frame costs about 4% of the client's work per op, bench W1).

    Its commonest operands, a tensor with a Python float or int or with a tensor of its shape
    and session, go the short way: the result has the tensor's shape, and its dtype is
    remembered per kind of operands, by their dtypes (ints by ``weak_int``): with numpy's
    weak Python scalars (NEP 50) nothing else, the ndim included, changes it. A dtype alone
    is the cheapest key (a tuple's building and hashing cost a twentieth of the op, bench W1).
    The wire args are made here, not in ``session.emit``'s loop. Anything else goes through
    ``session.apply``'s inference. ``depth``: the frames from the user's call to this one, 2
    where a function of fabric's passes the call on (a reflected operator, numpy's ufunc)."""
    # (one dict per kind of operands: a dtype compares equal to a Python type, np.float64
    # to float, so kinds must not share one)
    with_float: dict[Any, np.dtype] = {}
    float_with: dict[Any, np.dtype] = {}
    with_int: dict[Any, np.dtype] = {}
    int_with: dict[Any, np.dtype] = {}
    with_tensor: dict[Any, np.dtype] = {}

    def pair(left: Any, right: Any, depth: int = 1) -> Any:
        if type(left) is tensor_type:  # (first, second: the args as they travel)
            tensor, kind, first, second = left, type(right), left.id, right
            if kind is float:
                known, key = with_float, left.dtype
            elif kind is int and INT_RANGE[0] <= right < INT_RANGE[1]:
                known, key, second = with_int, (left.dtype, weak_int(right)), encode_scalar(right)
            elif kind is tensor_type and right.shape == left.shape \
                    and right.session is left.session:
                known, key, second = with_tensor, (left.dtype, right.dtype), right.id
            else:
                return left.session.apply(name, (left, right), {})
        else:  # the tensor is on the right: a reflected operator, or numpy's ufunc
            tensor, kind, first, second = right, type(left), left, right.id
            if kind is float:
                known, key = float_with, right.dtype
            elif kind is int and INT_RANGE[0] <= left < INT_RANGE[1]:
                known, key, first = int_with, (weak_int(left), right.dtype), encode_scalar(left)
            else:
                return right.session.apply(name, (left, right), {})
        dtype = known.get(key)
        if dtype is None:  # (numpy's refusal raises here, and is not remembered)
            dtype = known[key] = OPS[name].infer((left, right), NO_PARAMS)[1]
        frame, origin = _getframe(depth), LAST_ORIGIN[0]  # (issued_at's first test, inline)
        if frame.f_code is not origin[0] or frame.f_lasti != origin[1]:
            origin = issued_at(depth + 1)
        size, stream = tensor.size, tensor.session.stream
        tensor_id = next(stream.ids)  # (the entry in the wire's compact form, op_entry's)
        return stream.push(tensor_id, (tensor_id, name, first, second),
                           2 * size if kind is tensor_type else size, tensor.shape, dtype,
                           origin, size)
    pair.__name__ = pair.__qualname__ = name
    return pair


def elementwise_single(name: str, tensor_type: type[Spec]) -> Callable[..., Any]:
    """Elementwise op ``name`` on one tensor (``-t``, ``np.exp(t)``), the operator itself as
    in ``elementwise_pair``: the result has its shape, and a dtype remembered by dtype."""
    known: dict[np.dtype, np.dtype] = {}

    def single(operand: Any, depth: int = 1) -> Any:
        dtype = known.get(operand.dtype)
        if dtype is None:
            dtype = known[operand.dtype] = OPS[name].infer((operand,), NO_PARAMS)[1]
        frame, origin = _getframe(depth), LAST_ORIGIN[0]  # (as in pair)
        if frame.f_code is not origin[0] or frame.f_lasti != origin[1]:
            origin = issued_at(depth + 1)
        size, stream = operand.size, operand.session.stream
        tensor_id = next(stream.ids)  # (the entry in the wire's compact form, op_entry's)
        return stream.push(tensor_id, (tensor_id, name, operand.id), size, operand.shape,
                           dtype, origin, size)
    single.__name__ = single.__qualname__ = name
    return single
