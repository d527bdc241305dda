"""Benchmark W4: fused elementwise expressions on the numexpr device vs local numpy eager.

    python bench/w4_numexpr.py            # medians of 9 runs, prints times and ratios
    python bench/w4_numexpr.py --numpy-device   # also the remote numpy device, for context
    python bench/w4_numexpr.py --jax-device     # also the jax device (issue 42: at least the
                                                # numexpr device's rate)
    python bench/w4_numexpr.py --cupy-device    # also the cupy device (a GPU: issue 42, at
                                                # least 20x the numexpr device)

Two expressions on resident 10M-element float64 tensors, each ending with the read of a
scalar reduction: ``(2*a + 3*b*c - a/(b+1)).sum()`` and ``(sin(a)**2 + cos(b)**2).sum()``.
The remote figure is the whole user-visible time: sending the ops, the device's one fused
numexpr evaluation (which feeds the sum a block at a time, with no 80 MB temporary), and the
round trip of the read. The baseline is plain numpy
eager on the same arrays in this process, measured in the same run, interleaved with the
remote runs so that machine noise hits both alike. Target (issue 4): the remote numexpr
device at least 1.6x faster than local numpy eager on 2 cores.

The device uses both cores (numexpr's threads) where numpy eager uses one, so other load on
the machine slows the device more than the baseline: the best run of each is printed beside
the medians, with the load average when the benchmark started.
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

ELEMENTS = 10_000_000
EXPRESSIONS: dict[str, Callable[[Any, Any, Any], Any]] = {
    "2*a + 3*b*c - a/(b+1)": lambda a, b, c: 2 * a + 3 * b * c - a / (b + 1),
    "sin(a)**2 + cos(b)**2": lambda a, b, c: np.sin(a) ** 2 + np.cos(b) ** 2,
}


def timed(thunk: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``thunk`` took, and what it returned."""
    start = time.perf_counter()
    result = thunk()
    return time.perf_counter() - start, result


Figures = dict[str, tuple[list[float], list[float]]]


def measure(session: fabric.Session, arrays: list[np.ndarray], runs: int) -> Figures:
    """Per expression: the seconds of each remote run and of each local run."""
    tensors = [session.asarray(array) for array in arrays]
    session.sync()  # resident before any timing
    figures = {}
    for label, expression in EXPRESSIONS.items():
        def remote() -> float:
            return float(expression(*tensors).sum().numpy())

        def local() -> float:
            return float(expression(*arrays).sum())

        remote()  # warm up: the device compiles the expression's program once
        local()
        remote_times, local_times = [], []
        for _ in range(runs):
            seconds, got = timed(remote)
            remote_times.append(seconds)
            seconds, expected = timed(local)
            local_times.append(seconds)
        assert abs(got - expected) <= 1e-9 * abs(expected), f"{label}: {got!r} != {expected!r}"
        figures[label] = (remote_times, local_times)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="repetitions; medians are shown")
    parser.add_argument("--elements", type=int, default=ELEMENTS)
    parser.add_argument("--numpy-device", action="store_true",
                        help="also measure the remote numpy device (unfused), for context")
    parser.add_argument("--jax-device", action="store_true",
                        help="also measure the jax device (XLA, op by op: 10M-element ops "
                             "travel in batches of one or two)")
    parser.add_argument("--cupy-device", action="store_true",
                        help="also measure the cupy device (a GPU; its elementwise runs fused "
                             "once a batch is seen again)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.random(args.elements) for _ in range(3)]
    others = [backend for backend, asked in (("numpy", args.numpy_device),
                                             ("jax", args.jax_device),
                                             ("cupy", args.cupy_device)) if asked]
    backends = ["numexpr", *others]
    load = os.getloadavg()[0]
    results: dict[str, Figures] = {}
    settings: dict[str, Any] = {}
    for backend in backends:
        with fabric.LocalCluster(workers=1, backend=backend) as cluster, \
                cluster.connect(timeout=60) as session:
            settings[backend] = session.device.settings
            results[backend] = measure(session, arrays, args.runs)

    ne = settings["numexpr"]
    print(f"W4: {args.elements:,} float64 elements, medians (best) of {args.runs} runs; "
          f"numexpr {ne['version']} with {ne['threads']} threads, {os.cpu_count()} cores, "
          f"load average {load:.2f} at start")
    header = ["expression", "numexpr device ms", "local numpy ms", "speedup", "best speedup"]
    header[3:3] = [f"{backend} device ms" for backend in others]
    rows = [header]
    sums = {backend: [0.0, 0.0] for backend in ["local", *backends]}  # medians, bests
    for label in [*EXPRESSIONS, "both"]:
        if label != "both":
            for backend in backends:
                remote, local = results[backend][label]
                sums[backend][0] += statistics.median(remote)
                sums[backend][1] += min(remote)
                if backend == "numexpr":
                    sums["local"][0] += statistics.median(local)
                    sums["local"][1] += min(local)
            figures = {backend: (statistics.median(results[backend][label][0]),
                                 min(results[backend][label][0])) for backend in backends}
            local_times = results["numexpr"][label][1]
            figures["local"] = (statistics.median(local_times), min(local_times))
        else:
            figures = {backend: tuple(values) for backend, values in sums.items()}
        (remote, remote_best), (local, local_best) = figures["numexpr"], figures["local"]
        row = [label, f"{remote * 1e3:.1f} ({remote_best * 1e3:.1f})",
               f"{local * 1e3:.1f} ({local_best * 1e3:.1f})", f"{local / remote:.2f}x",
               f"{local_best / remote_best:.2f}x"]
        row[3:3] = [f"{figures[b][0] * 1e3:.1f} ({figures[b][1] * 1e3:.1f})" for b in others]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    print("target: the numexpr device at least 1.6x faster than local numpy eager")


if __name__ == "__main__":
    main()
