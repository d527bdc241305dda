"""What the benchmarks share to time a call."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def seconds(run: Callable[[], Any]) -> float:
    """The wall time of one ``run()``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``run()`` over ``repeats`` calls, after one to warm up."""
    run()
    return statistics.median(seconds(run) for _ in range(repeats))
