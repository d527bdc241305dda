"""Temporaries elided on a device, as numpy elides them in ``a + b + c``.

Rule: numpy writes ``(a + b) + c`` into the memory of ``a + b``, a temporary no one else
holds, when it is large (from 256 KiB: below, the checks cost more than a fresh allocation
saves) and the result has its shape and dtype. A device sees the same chance in the op
stream: an elementwise op followed at once by the free of one of its inputs (the client let
the tensor go the moment it was used, as Python drops the temporary). Such an input's memory
takes the result (``out=``) where nothing else on the device sees it (it owns its memory and
the session's table holds the only reference: ``workers.in_place``'s test), the result has
its shape (the other inputs broadcast to it) and the ufunc's loop for its dtype makes that
same dtype, so the values are numpy's own: on bench
``programs.py``'s heat stencil, fresh results ran the adds 40% and the subtracts twice as
slow as numpy's elided ones (their inputs were no longer in cache).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

ELIDE_FROM_BYTES = 1 << 18  # numpy's own threshold (NPY_MIN_ELIDE_BYTES)
ELIDE_FROM_ELEMENTS = ELIDE_FROM_BYTES // 8  # (the executor's cheap first test, any dtype)
# The references of an input that nothing else sees, while it is checked: the session's
# table, the op's list of inputs, and getrefcount's argument (no name here is bound to it).
_ALONE = 3
_FREES_LOOKED_AT = 4  # the entries after an op among which its inputs' frees are looked for
_keeps_dtype: dict[tuple[np.ufunc, str], bool] = {}


def reusable_input(ufunc: np.ufunc, ops: Sequence[Any], position: int, args: Sequence[Any],
                   inputs: list[Any]) -> np.ndarray | None:
    """The input of ``ufunc``'s op at ``ops[position]`` (its wire ``args``, their values
    ``inputs``) whose memory its result may take, or None. The caller must hold no other
    name for the inputs."""
    freed = []
    for entry in ops[position + 1:position + 1 + _FREES_LOOKED_AT]:
        if type(entry) is not int:
            break  # (a later op may read any input)
        freed.append(entry)
    if freed:
        for index, arg in enumerate(args):
            if type(arg) is int and arg in freed and _alone(ufunc, inputs, index):
                return inputs[index]
    return None


def _alone(ufunc: np.ufunc, inputs: list[Any], index: int) -> bool:
    # (inputs[index] each time: a name for it would be one more reference)
    if type(inputs[index]) is not np.ndarray or sys.getrefcount(inputs[index]) != _ALONE:
        return False
    if not (inputs[index].nbytes >= ELIDE_FROM_BYTES and inputs[index].base is None
            and inputs[index].flags.writeable and keeps_dtype(ufunc, inputs[index].dtype)):
        return False
    shape = inputs[index].shape
    if all(type(other) is not np.ndarray or other.shape == shape for other in inputs):
        return True  # (the commonest case, at a tenth of broadcast_shapes' cost)
    try:
        return np.broadcast_shapes(*[np.shape(v) for v in inputs]) == shape
    except ValueError:  # (the op fails, with the ufunc's own words)
        return False


def keeps_dtype(ufunc: np.ufunc, dtype: np.dtype) -> bool:
    """Whether ``ufunc`` is elementwise with a loop from ``dtype`` inputs to a ``dtype``
    result (``add`` on float64; not ``greater``, nor ``true_divide`` on ints, nor ``matmul``)."""
    key = (ufunc, dtype.char)
    known = _keeps_dtype.get(key)
    if known is None:
        known = _keeps_dtype[key] = (ufunc.signature is None and ufunc.nout == 1 and (
            f"{dtype.char * ufunc.nin}->{dtype.char}" in ufunc.types))
    return known


def run_elided(ufunc: np.ufunc, ops: Sequence[Any], position: int, args: Sequence[Any],
               inputs: list[Any]) -> np.ndarray:
    """``ufunc(*inputs)``, the op at ``ops[position]``, written into an input's memory where
    ``reusable_input`` finds one. 'safe' casting then refuses a loop of another dtype than
    that input's (another input of a wider dtype), and the op runs as usual."""
    reused = reusable_input(ufunc, ops, position, args, inputs)
    if reused is not None:
        try:
            return ufunc(*inputs, out=reused, casting="safe")
        except TypeError:  # (UFuncTypeError, raised before anything is written)
            pass
    return ufunc(*inputs)
