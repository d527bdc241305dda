"""W3 into device memory: 256 MiB of float64 uploaded to a device and read back, on each
device named, beside the numpy device (the host path: the tensor stays in the worker's host
memory), in the same run.

    python bench/w3_devices.py --backends numpy cupy       # medians of 5 interleaved runs
    python bench/w3_devices.py --backends numpy jax --mib 16   # (a CPU: the script itself)

Issue 42: on a GPU machine, the cupy and jax devices' rates at least 0.8x the host path's
(uploads and reads staged through pinned host buffers). An upload is timed to its ``sync``
(the array whole on the device), a read to its bytes in the client's hands.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.workers.backends import BACKENDS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--mib", type=int, default=256, help="the tensor's size in MiB")
    parser.add_argument("--backends", nargs="+", choices=sorted(BACKENDS),
                        default=["numpy", "cupy"], help="the first is the baseline")
    args = parser.parse_args()
    data = np.random.default_rng(0).random(args.mib * (1 << 20) // 8)
    times: dict[str, dict[str, list[float]]] = {
        backend: {"upload": [], "read": []} for backend in args.backends}
    with contextlib.ExitStack() as stack:
        sessions = {}
        for backend in args.backends:
            cluster = stack.enter_context(fabric.LocalCluster(workers=1, backend=backend))
            sessions[backend] = stack.enter_context(cluster.connect(timeout=60))
        for _ in range(args.runs):
            for backend, session in sessions.items():  # (interleaved: load hits them alike)
                started = time.perf_counter()
                tensor = session.asarray(data)
                session.sync()
                times[backend]["upload"].append(time.perf_counter() - started)
                started = time.perf_counter()
                back = tensor.numpy()
                times[backend]["read"].append(time.perf_counter() - started)
                assert back[-1] == data[-1] and back.shape == data.shape
                del tensor, back
    base = args.backends[0]
    print(f"W3 devices: {args.mib} MiB float64 up and back, medians of {args.runs} runs, "
          f"GB/s (vs the {base} device)")
    for backend in args.backends:
        cells = []
        for way in ("upload", "read"):
            rate = data.nbytes / statistics.median(times[backend][way]) / 1e9
            baseline = data.nbytes / statistics.median(times[base][way]) / 1e9
            cells.append(f"{way} {rate:.2f} ({rate / baseline:.2f}x)")
        print(f"  {backend:8} " + "  ".join(cells))
    print("target (a GPU machine): cupy and jax at least 0.8x the numpy device's host path")


if __name__ == "__main__":
    main()
