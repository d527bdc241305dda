"""Benchmark W5: a 50-op elementwise step called 1,000 times on 1,000-element tensors.

    python bench/w5_graphs.py            # medians of 5 runs, numpy device (and numexpr if built)

Three ways to run the same step, measured in the same run: replayed as a registered graph
(``fabric.function``), streamed op by op (the same function, not traced), and local numpy
eager on the same arrays. Each way feeds a call's result to the next call and ends with one
read of the result. Target (issue 4): replay at least 5x faster than plain streaming.
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
from fabric.workers.backends import BACKENDS  # noqa: E402

CALLS = 1_000
ELEMENTS = 1_000
ROUNDS = 10  # 5 ops per round: 50 ops per step


def step(x: Any, b: Any, c: Any) -> Any:
    """The 50-op elementwise step: ten rounds of x = tanh(x*b + c)*0.5 + x."""
    for _ in range(ROUNDS):
        x = np.tanh(x * b + c) * 0.5 + x
    return x


def run(call: Callable[[Any, Any, Any], Any], x: Any, b: Any, c: Any,
        read: Callable[[Any], np.ndarray]) -> tuple[float, np.ndarray]:
    """Seconds for CALLS chained calls and the final read; and the result."""
    start = time.perf_counter()
    for _ in range(CALLS):
        x = call(x, b, c)
    result = read(x)
    return time.perf_counter() - start, result


def measure(session: fabric.Session, arrays: list[np.ndarray], runs: int,
            expected: np.ndarray) -> dict[str, float]:
    """Median seconds of graph replay and of op streaming on ``session``."""
    x, b, c = (session.asarray(a) for a in arrays)
    replayed = fabric.function(step)
    replayed(x, b, c).numpy()  # trace and register once, outside the timing
    times: dict[str, list[float]] = {"replay": [], "streaming": []}
    for _ in range(runs):
        for name, call in (("replay", replayed), ("streaming", step)):
            seconds, result = run(call, x, b, c, lambda t: t.numpy())
            np.testing.assert_allclose(result, expected, rtol=1e-9)
            times[name].append(seconds)
    stats = session.stats()
    assert stats["graph_registrations"] == 1, stats
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.random(ELEMENTS), rng.random(ELEMENTS) * 0.5, rng.random(ELEMENTS) - 0.5]
    local_times = []
    for _ in range(args.runs):
        seconds, expected = run(step, *arrays, read=np.asarray)
        local_times.append(seconds)
    local = statistics.median(local_times)

    print(f"W5: {ROUNDS * 5}-op elementwise step x {CALLS:,} calls on {ELEMENTS:,}-element "
          f"float64 tensors, medians of {args.runs} runs (ms per {CALLS:,} calls)")
    header = ("device", "replay", "streaming", "local numpy", "replay vs streaming",
              "replay vs local")
    rows = [header]
    for backend in [b for b in ("numpy", "numexpr") if b in BACKENDS]:
        with fabric.LocalCluster(workers=1, backend=backend) as cluster, \
                cluster.connect(timeout=60) as session:
            medians = measure(session, arrays, args.runs, expected)
        rows.append((backend, f"{medians['replay'] * 1e3:.1f}",
                     f"{medians['streaming'] * 1e3:.1f}", f"{local * 1e3:.1f}",
                     f"{medians['streaming'] / medians['replay']:.1f}x faster",
                     f"{local / medians['replay']:.2f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))


if __name__ == "__main__":
    main()
