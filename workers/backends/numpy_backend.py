"""The numpy device: every op runs eagerly with numpy on arrays held in worker memory."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import numpy as np


class NumpyDevice:
    """One numpy device of a worker; ``index`` is its local index on that worker."""

    backend = "numpy"
    # ``run(op, inputs, {})`` is ``np.asarray(op.impl(*inputs))``: the executor may make
    # that call itself (every op of a stream then costs two Python calls less).
    plain_calls = True

    def __init__(self, index: int) -> None:
        self.index = index

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        return {"backend": self.backend, "version": np.__version__,
                "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
                "fuses": []}

    def run(self, op: Any, inputs: list[Any], params: dict[str, Any]) -> np.ndarray:
        """Run one op of the shared table eagerly."""
        return np.asarray(op.impl(*inputs, **params))

    def materialize(self, value: np.ndarray) -> np.ndarray:
        """The array of a value: this device never defers, so the value itself."""
        return value

    def bind(self, op: Any, params: dict[str, Any]) -> Callable[..., Any]:
        """``op`` with its params bound: a function of its inputs, for compiled graphs."""
        return functools.partial(op.impl, **params) if params else op.impl
