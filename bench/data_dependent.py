"""What a data-dependent shape costs: ``a[mask]`` and ``np.unique`` learn their result's shape
from the device at the call (one small round trip), where ``a[idx]`` (an integer tensor) and
an update ``a[mask] = v`` need none.

    python bench/data_dependent.py [--size N] [--repeats R]

Each figure is the median, over R calls, of the client's wall time for one call (no read of
the result); numpy's own time for the same call on a local array is printed beside it, and
the ratio of the two. The round trip is the difference between ``a[mask]`` and ``a[idx]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402


def median_ms(call: Callable[[], Any], repeats: int, settle: Callable[[], Any]) -> float:
    """The median wall time of ``call`` in milliseconds, ``settle`` run (untimed) after each
    (so queued work of one call is not charged to the next)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        settle()
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="elements of the array")
    parser.add_argument("--repeats", type=int, default=200, help="calls per figure")
    options = parser.parse_args()
    rng = np.random.default_rng(0)
    local = rng.standard_normal(options.size)
    local_mask, local_idx = local > 0, rng.integers(0, options.size, options.size // 2)
    with fabric.connect() as session:
        a = session.asarray(local)
        mask, idx = session.asarray(local_mask), session.asarray(local_idx)
        small = session.asarray(np.round(local * 10))
        session.sync()
        cases = {
            "a[idx] (shape known)": (lambda: a[idx], lambda: local[local_idx]),
            "a[mask] (round trip)": (lambda: a[mask], lambda: local[local_mask]),
            "np.nonzero(mask)": (lambda: np.nonzero(mask), lambda: np.nonzero(local_mask)),
            "np.unique (round trip)": (lambda: np.unique(small),
                                       lambda: np.unique(np.round(local * 10))),
            "a[mask] = 0 (update)": (lambda: a.__setitem__(mask, 0),
                                     lambda: local.copy().__setitem__(local_mask, 0)),
        }
        print(f"{options.size:,} elements, median of {options.repeats} calls "
              f"(fabric: client wall time per call, on an embedded local cluster)")
        figures = {}
        for name, (remote, numpy_call) in cases.items():
            figures[name] = median_ms(remote, options.repeats, session.sync)
            mine = median_ms(numpy_call, options.repeats, lambda: None)
            print(f"  {name:26s} fabric {figures[name]:7.3f} ms   numpy {mine:7.3f} ms   "
                  f"ratio {figures[name] / mine:6.1f}x")
        trip = figures["a[mask] (round trip)"] - figures["a[idx] (shape known)"]
        print(f"  the shape's round trip: about {trip:.3f} ms a call")


if __name__ == "__main__":
    main()
