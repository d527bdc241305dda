"""A worker's memory budget, sans I/O: the bytes all of its devices' sessions may hold.

Rule: a byte is admitted before it is allocated, against one budget for the whole worker (all
its devices, all their sessions). What an op needs is its result and room for one temporary:
``need`` says how much, from shapes and dtypes alone; for an op whose result's size depends on
its data (``DATA_DEPENDENT_OPS``), from a look at the data that allocates nothing
(``data_need``: a bincount's largest value, an argwhere's count of non-zeros, a repeat's
counts, the columns lstsq's residuals sum). Each device
thread draws grants from the budget under a lock and spends them without one (its held bytes
are its own, written by its thread only); a device gives back what it holds past ``chunk``
after each message, so an idle device keeps at most that much of the budget from the others.

The default budget (``fabric.core.worker_options.budget_from_option``) is a share of the
memory this process may use when it starts.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from fabric.core.ops import OPS, Spec
from fabric.core.wire import decode_params

_MAX_CHUNK = 64 << 20  # the most of the budget a device keeps unspent between messages
_TEMPORARY_ITEMSIZE = 8  # the temporary an op may make: one float64 per operand element
# Ops whose result has at most as many elements as the product of their tensor inputs'
# (when none is empty), an input of the first one's shape counted once: elementwise ops
# (broadcasting included), reductions, scans, copies, and updates (their target's shape;
# the target comes first).
SAME_SIZE_OPS = frozenset(name for name, op in OPS.items() if op.elementwise or op.name in (
    "sum", "prod", "mean", "std", "var", "min", "max", "any", "all", "argmin", "argmax",
    "cumsum", "cumprod", "sort", "argsort", "copy", "roll", "setitem", "ufunc_at"))
# What an op of SAME_SIZE_OPS needs at most per element of that product: a result element
# (complex128 is the widest) and its temporary.
BOUND_PER_ELEMENT = 16 + _TEMPORARY_ITEMSIZE
# What an op takes that is no tensor: the scalars of the wire (``decode_scalar``); anything
# else is a device's value (a numpy array, a deferred value, another module's array).
_SCALARS = (int, float, complex, np.generic, type(None))


def elements(value: Any) -> int:
    """How many elements a tensor value (an array, or a device's deferred value) has."""
    return math.prod(value.shape)


def need(result_bytes: int, operand_elements: int) -> int:
    """The bytes an op is admitted for: its result, and one float64 temporary the size of its
    largest operand (numpy's reductions upcast, and BLAS copies a strided input)."""
    return result_bytes + _TEMPORARY_ITEMSIZE * operand_elements


def exact_need(result: tuple[tuple[int, ...], np.dtype], inputs: Sequence[Any]) -> int:
    """``need`` of an op whose result has the shape and dtype ``result`` (as inferred by
    the op table), given its inputs."""
    shape, dtype = result
    count = math.prod(shape)
    largest = max([count, *(elements(v) for v in inputs if not isinstance(v, _SCALARS))])
    return need(count * np.dtype(dtype).itemsize, largest)


_MAX_REMEMBERED = 4096  # op signatures whose need inferred_need keeps
_remembered: dict[tuple[Any, ...], tuple[int, int]] = {}


def inferred_need(name: str, inputs: Sequence[Any], params: dict[str, Any]) -> tuple[int, int]:
    """The bytes op ``name`` of the table makes on ``inputs`` (tensor values and scalars)
    with wire ``params``, and its ``exact_need``, by the table's shape and dtype rules.

    Remembered per signature (each tensor's shape and dtype, each scalar's type and value, the
    params), as the rules see nothing else: a loop sends the same ops again and again, and
    inferring a matmul's or a mask update's shape cost more than running it on small arrays.
    Raises what the rules raise (not remembered)."""
    key: tuple[Any, ...] | None = (name, *[
        (v.shape, v.dtype) if not isinstance(v, _SCALARS) else (type(v), v) for v in inputs],
        *params.items())
    try:
        known = _remembered.get(key)  # type: ignore[arg-type]
    except TypeError:  # (a param holds a list: not hashable, inferred each time)
        known, key = None, None
    if known is not None:
        return known
    specs = [Spec(v.shape, v.dtype) if not isinstance(v, _SCALARS) else v for v in inputs]
    shape, dtype = OPS[name].infer(specs, decode_params(name, params) if params else {})
    result = (shape, np.dtype(dtype))
    known = (math.prod(shape) * result[1].itemsize, exact_need(result, inputs))
    if key is not None:
        if len(_remembered) >= _MAX_REMEMBERED:
            _remembered.clear()
        _remembered[key] = known
    return known


def data_need(name: str, inputs: Sequence[Any], params: dict[str, Any]) -> tuple[int, int]:
    """The bytes op ``name`` of ``DATA_DEPENDENT_OPS`` makes on ``inputs`` (arrays, and
    scalars) with wire ``params``, and what it needs, from its data: read, never copied (the
    largest value, a count of non-zeros). Inputs numpy refuses need nothing here: the op
    raises numpy's error when it runs."""
    array = inputs[0] if inputs else None
    if not isinstance(array, np.ndarray):
        return 0, 0
    count = array.size
    if name == "bincount":  # max(x) + 1 counts (minlength at least), of intp or float64
        minlength = params.get("minlength", 0)
        minlength = minlength if type(minlength) is int and minlength >= 0 else 0
        if array.ndim != 1 or array.dtype.kind not in "iub":
            return 0, 0
        largest = int(array.max()) if count else -1
        result = 8 * max(largest + 1, minlength)
    elif name == "argwhere":  # one row of intp indexes per non-zero element
        result = 8 * max(array.ndim, 1) * int(np.count_nonzero(array))
    elif name == "repeat":  # each slice along the axis (an element, flat) as often as counted
        result = _repeated_bytes(array, inputs[1] if len(inputs) > 1 else None,
                                 params.get("axis"))
    elif name == "lstsq_residuals":  # at most one float64 per column of b
        b = inputs[1] if len(inputs) > 1 else None
        result = 8 * (b.shape[-1] if isinstance(b, np.ndarray) and b.ndim == 2 else 1)
    else:  # unique, or one of its parts: at most one element (or one intp) per element
        result = count * max(array.dtype.itemsize, 8)
    return result, need(result, count)


def _repeated_bytes(array: np.ndarray, counts: Any, axis: Any) -> int:
    """The bytes ``np.repeat(array, counts, axis)`` makes (0 where numpy refuses it)."""
    if not isinstance(counts, np.ndarray) or counts.dtype.kind not in "iu" or counts.ndim > 1:
        return 0
    if axis is None:
        length, slices = array.size, array.size
    elif type(axis) is int and -array.ndim <= axis < array.ndim:
        length, slices = array.shape[axis], array.shape[axis]
    else:
        return 0
    if counts.ndim == 1 and counts.size != length:
        return 0
    total = int(counts.sum()) if counts.ndim else int(counts) * length
    per_slice = array.size // slices if slices else 0
    return array.dtype.itemsize * per_slice * max(total, 0)


class Resident(Protocol):
    """What ``Allowance.charge`` counts a tensor against: a session (``DeviceSession``)."""

    resident: int  # the bytes the session's tensors hold


class MemoryBudget:
    """``limit`` bytes (None: no limit) shared by the ``Allowance`` of each device."""

    def __init__(self, limit: int | None, devices: int = 1) -> None:
        self.limit = limit
        self.chunk = min(_MAX_CHUNK, limit // (8 * max(devices, 1))) if limit else 0
        self.allowances: list[Allowance] = []
        self._lock = threading.Lock()

    def allowance(self) -> "Allowance":
        """A new device's share: what it holds and what it was granted."""
        allowance = Allowance(self)
        self.allowances.append(allowance)
        return allowance

    def held(self) -> int:
        """Bytes held by every device of the worker (a glance: each changes as it runs)."""
        return sum(a.held for a in self.allowances)

    def _grow(self, allowance: "Allowance", amount: int) -> bool:
        with self._lock:
            free = self.limit - sum(a.granted for a in self.allowances)
            short = allowance.held + amount - allowance.granted
            if short > free:
                return False
            allowance.granted += min(free, short + self.chunk)
            return True


class Allowance:
    """One device's part of a ``MemoryBudget``: ``held`` bytes of its sessions' tensors (and
    of its own shared memory: ``workers.device_pool.DevicePool``), within ``granted``
    bytes drawn from the budget. Used by that device's thread only. ``reclaim``, where set:
    frees what the device holds only to reuse it (its free shared memory) when the budget is
    short; whether it freed any."""

    __slots__ = ("budget", "held", "granted", "reclaim")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.held = 0
        self.granted = 0 if budget.limit is not None else math.inf
        self.reclaim: Callable[[], bool] | None = None

    def charge(self, session: Resident, nbytes: int) -> None:
        """Count ``nbytes`` more held by ``session`` (its ``resident`` bytes) and so by this
        device, as a tensor is stored or pinned: the one place the two move together, but
        for ``Executor._run``'s op loop, which spells this and ``refund`` inline (a call per
        op costs 4% of a worker's op)."""
        session.resident += nbytes
        self.held += nbytes

    def refund(self, session: Resident, nbytes: int) -> None:
        """Count ``nbytes`` fewer held by ``session`` and by this device (a tensor freed, a
        pin let go, the session closed)."""
        session.resident -= nbytes
        self.held -= nbytes

    def fits(self, amount: int) -> bool:
        """Whether ``amount`` more bytes may be allocated now (drawing on the budget if the
        grant is short, and reclaiming if it is short still); they count as held once
        stored."""
        return self.held + amount <= self.granted or self.budget._grow(self, amount) or (
            self.reclaim is not None and self.reclaim() and self.budget._grow(self, amount))

    def settle(self) -> None:
        """Give back what is granted past ``chunk`` more than held (after each message)."""
        budget = self.budget
        if budget.limit is not None and self.granted - self.held > 2 * budget.chunk:
            with budget._lock:
                self.granted = self.held + budget.chunk
