"""A loop that uploads while its device computes: each step uploads an 8 MiB array
(through shared memory) and queues a matmul on the device, and nothing waits for the device
until the loop's end. An upload that waits for the device's queued work makes the loop run
at the device's pace plus the uploads'; one that does not overlaps the two.

    python bench/shm_loop.py            # medians of 5 runs of 40 steps, ms per step

"loop" is the loop (uploads and ops); "ops alone" is the same ops without uploads and
"uploads alone" the same uploads without ops, for scale: a loop that overlaps them runs
close to the larger of the two, one that serialises them close to their sum.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402


def steps(session: fabric.Session, arrays: list[np.ndarray] | None, matrix: fabric.Tensor | None,
          count: int) -> float:
    """ms per step of ``count`` steps, each an upload (of the next of ``arrays``) and a
    matmul of ``matrix``, or either alone, timed until the device has run them all."""
    session.sync()
    kept = []
    start = time.perf_counter()
    for i in range(count):
        if arrays is not None:
            kept.append(session.asarray(arrays[i % len(arrays)]).sum())
        if matrix is not None:
            kept.append((matrix @ matrix).sum())
        if len(kept) > 8:  # (a loop keeps a few results, not every one)
            del kept[:2]
    session.sync()
    elapsed = time.perf_counter() - start
    del kept
    session.sync()
    return elapsed / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--steps", type=int, default=40, help="steps per run")
    parser.add_argument("--size", type=int, default=500, help="the matmul's side")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrays = [rng.random(1 << 20) for _ in range(4)]  # 8 MiB each
    figures: dict[str, list[float]] = {}
    with fabric.LocalCluster(workers=1) as cluster, \
            fabric.connect(cluster.address, token=cluster.token, timeout=120) as session:
        matrix = session.asarray(rng.random((args.size, args.size)))
        for _ in range(args.runs):  # interleaved: a noisy neighbour slows all alike
            for name, uploads, ops in (("loop", arrays, matrix), ("ops alone", None, matrix),
                                       ("uploads alone", arrays, None)):
                figures.setdefault(name, []).append(steps(session, uploads, ops, args.steps))
        assert session.shares_memory is True, "the shared-memory path was not taken"
    median = {name: statistics.median(values) for name, values in figures.items()}
    overlap = max(median["ops alone"], median["uploads alone"])
    serial = median["ops alone"] + median["uploads alone"]
    print(f"upload 8 MiB + {args.size}x{args.size} matmul per step; medians of {args.runs} "
          f"runs of {args.steps} steps, ms per step")
    for name, value in median.items():
        print(f"{name:<16}{value:>8.2f}")
    print(f"loop / max(ops, uploads) {median['loop'] / overlap:.2f}   "
          f"loop / (ops + uploads) {median['loop'] / serial:.2f}")


if __name__ == "__main__":
    main()
