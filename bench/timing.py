"""What the benchmarks share to time a call."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``run()`` over ``repeats`` calls, after one to warm up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
