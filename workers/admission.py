"""An op's admission on a device, sans I/O: whether it may allocate its result, mixed into
``Executor``.

Rule: an op is admitted before it allocates, against its session's ``--memory-limit`` and its
device's part of the worker's ``MemoryBudget`` (``workers.memory``): a bound from its inputs'
sizes where that suffices (``SAME_SIZE_OPS``), else the op table's shape and dtype rules
(``inferred_need``); where the result's size depends on the data (bincount, argwhere,
unique), a look at the data that allocates nothing (``data_need``). A refusal is a
``QuotaExceeded`` that names the op, the bytes and what to do; the executor poisons the op's
output with it.
"""

from __future__ import annotations

from typing import Any

from fabric.core.errors import QuotaExceeded
from fabric.core.flow import bytes_text
from fabric.core.ops import DATA_DEPENDENT_OPS, OPS

from .backends.base import DeferredValue
from .device_session import DeviceSession
from .memory import BOUND_PER_ELEMENT, SAME_SIZE_OPS, Allowance, data_need, inferred_need


class Admission:
    """The executor's admission checks; it sets ``memory_limit`` and ``allowance``."""

    memory_limit: int | None
    allowance: Allowance

    def _admit(self, session: DeviceSession, name: str, inputs: list[Any],
               params: dict[str, Any], elements: int) -> None:
        """Refuse op ``name`` of the table before it allocates (``_require``). Where it is one
        of ``SAME_SIZE_OPS``, or a basic index (the indexed array its only input), and no
        input is empty, ``elements`` (the product of its tensor inputs' sizes, an input of the
        first one's shape counted once) bounds its size; else its shape rule tells it."""
        limit, bound = self.memory_limit, BOUND_PER_ELEMENT * elements
        if elements and (name in SAME_SIZE_OPS or name == "getitem" and len(inputs) == 1) and (
                limit is None or session.resident + bound <= limit) and self.allowance.fits(bound):
            return
        if name not in OPS:
            return  # an upload (checked in _compute) or an unknown op (which fails there)
        if name in DATA_DEPENDENT_OPS:  # (its shape rule knows no size: the data tells it)
            inputs = [self.device.materialize(v) if isinstance(v, DeferredValue) else v
                      for v in inputs]
            self._require(session, name, *data_need(name, inputs, params))
            return
        self._require(session, name, *inferred_need(name, inputs, params))

    def _require(self, session: DeviceSession, what: str, result_bytes: int,
                 amount: int) -> None:
        """Raise QuotaExceeded unless ``what`` may hold ``result_bytes`` more in the session
        (its --memory-limit) and allocate ``amount`` bytes on the worker (its budget)."""
        limit = self.memory_limit
        if limit is not None and session.resident + result_bytes > limit:
            raise QuotaExceeded(
                f"{what} needs {bytes_text(result_bytes)} more but the session already holds "
                f"{bytes_text(session.resident)} of its --memory-limit of {bytes_text(limit)}: "
                "free tensors (del them), work in smaller pieces, or ask for a larger "
                "--memory-limit.", limit=limit, resident=session.resident,
                requested=result_bytes)
        if not self.allowance.fits(amount):
            budget = self.allowance.budget
            held = budget.held()
            raise QuotaExceeded(
                f"{what} needs {bytes_text(amount)} (its result of {bytes_text(result_bytes)} "
                f"and room to compute it) but this worker's devices hold {bytes_text(held)} of "
                f"its memory budget of {bytes_text(budget.limit)}: free tensors (del them), "
                "work in smaller pieces, or start the worker with a larger --memory-budget. "
                "The worker goes on serving.", budget=budget.limit, requested=amount, held=held)
