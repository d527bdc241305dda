"""The numpy device: every op runs eagerly with numpy on arrays held in worker memory.

Rule: this is the reference device; it adds nothing to the shared op table's numpy
implementations, so every other backend is checked against it.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import numpy as np

from fabric.core.ops import Op

from ..threads import limited_to
from .base import Backend


class NumpyDevice(Backend):
    """One numpy device of a worker; ``index`` is its local index on that worker."""

    backend = "numpy"
    plain_below = sys.maxsize  # every op (past it, run makes the very same call)

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        return {"backend": self.backend, "version": np.__version__,
                "threads": limited_to() or os.cpu_count() or 1,
                "fuses": []}

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> np.ndarray:
        """Run one op of the shared table eagerly."""
        return np.asarray(op.impl(*inputs, **params))

    def bind(self, op: Op, params: dict[str, Any]) -> Callable[..., Any]:
        """``op``'s own implementation, its params bound (no ``run`` around each call)."""
        return functools.partial(op.impl, **params) if params else op.impl
