"""Random tensors, drawn on the device from the session's own generator.

Rule: draws are made on the device and never cross the wire; a seed is an op of the stream,
so the draws after it are reproducible and ordered with every other op. Bounds and dtypes are
checked here, before anything is sent.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

import numpy as np

from fabric.arrays.stream import OpStream
from fabric.arrays.tensor import Tensor
from fabric.core.wire import device_dtype


class TensorMaker(Protocol):
    """What ``Random`` needs of its session: its stream, and creation ops."""

    stream: OpStream

    def create(self, name: str, shape: Any, dtype: Any, **params: Any) -> Tensor: ...


class Random:
    """Seeded random tensors on the device: ``seed``, ``uniform``, ``normal``."""

    def __init__(self, session: TensorMaker) -> None:
        self._session = session

    def seed(self, seed: int) -> None:
        """Reset the session's generator on the device; later draws are reproducible.
        ``seed``: an integer from 0 to 2**64 - 1."""
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} is out of range: use an integer from 0 to 2**64 - 1.")
        self._session.stream.enqueue(["seed", 0, [], {"seed": seed}])

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = (),
                dtype: Any = "float64") -> Tensor:
        """Uniform draws from [low, high), of shape ``size``."""
        return self._session.create("uniform", size, dtype, low=low, high=high)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = (),
               dtype: Any = "float64") -> Tensor:
        """Normal draws of mean ``loc`` and deviation ``scale``, of shape ``size``."""
        return self._session.create("normal", size, dtype, loc=loc, scale=scale)

    def random(self, size: Any = (), dtype: Any = "float64") -> Tensor:
        """Uniform draws from [0, 1), of shape ``size``, as numpy's ``Generator.random``."""
        return self.uniform(0.0, 1.0, size, dtype)

    def integers(self, low: int, high: int | None = None, size: Any = (),
                 dtype: Any = "int64", endpoint: bool = False) -> Tensor:
        """Integers drawn uniformly from [low, high) ([low, high] with ``endpoint``; from
        [0, low) without ``high``), as numpy's ``Generator.integers``."""
        low, high = (0, low) if high is None else (low, high)
        low, high = operator.index(low), operator.index(high)
        if high < low or high == low and not endpoint:
            raise ValueError(f"low >= high: no integer lies in [{low}, {high}"
                             f"{']' if endpoint else ')'}; give a low below high.")
        dtype = device_dtype(dtype)
        if dtype.kind not in "biu":
            raise TypeError(f"integers draws integers: dtype {dtype} is not an integer "
                            "dtype; use uniform for floats.")
        bounds = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if low < bounds[0] or (high if endpoint else high - 1) > bounds[1]:
            raise ValueError(f"{'low' if low < bounds[0] else 'high'} is out of bounds for "
                             f"{dtype}: its values lie in [{bounds[0]}, {bounds[1]}].")
        return self._session.create("integers", size, dtype, low=low, high=high,
                                    endpoint=endpoint)
