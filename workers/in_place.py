"""Updates written into their target's own memory on a device, where no one can tell.

Rule: an update (``t[i] = v``, ``np.add.at``) is copy on write (``fabric.core.ops``): it makes a
new array, so that tensors made from the target's old value keep theirs. When the client
marks the op ``in_place`` (it lets the target go right after: the tensor's handle moves to
the update's result, so the old value is never read again), that copy is wasted wherever
nothing else on the device sees the target's memory; the update then writes into the target
and its result takes over the target's array (a stencil step's copy of its grid: bench
``programs.py``'s heat). Nothing else sees it when the array owns its memory (it is no view
of another array) and the session's table holds the only reference to it: no view of it, no
other tensor id, no deferred chain of the numexpr device. Its reference count says so.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from fabric.core.ops import WRITES_IN_PLACE
from fabric.core.wire import decode_params, decode_scalar

from .device_session import DeviceSession

# The references of a target that nothing else sees, while it is checked: the session's
# table, the local name, and getrefcount's own argument.
_ALONE = 3


def write_in_place(session: DeviceSession, name: str, out: int, args: list[Any],
                   params: dict[str, Any]) -> bool:
    """Run update ``name`` (its wire ``args`` and ``params``) of ``session`` (an executor's
    ``DeviceSession``) into its target's own array, which the session then holds as ``out``
    (and no longer as the target's id, which the client frees next); False, with nothing
    done, where it may not, and the op runs as any other. ``params`` loses its ``in_place``
    mark either way."""
    tensors = session.tensors
    if not params.pop("in_place", False) or out in tensors or out in session.poisoned:
        return False
    target = tensors.get(args[0])
    if (type(target) is not np.ndarray or target.base is not None
            or not target.flags.writeable or sys.getrefcount(target) != _ALONE):
        return False
    inputs = []
    for arg in args[1:]:
        if type(arg) is int:
            value = tensors[arg]
            if type(value) is not np.ndarray:  # (a deferred value: the usual run computes it)
                return False
            inputs.append(value)
        else:
            inputs.append(decode_scalar(arg))
    WRITES_IN_PLACE[name](target, *inputs, **decode_params(name, params))
    tensors[out] = tensors.pop(args[0])
    return True
