"""A user's first transfers of a large array, as a new user makes them: for each size, a fresh
cluster (two workers) and a fresh session, one small op to warm the session up, then the first
upload (``s.asarray(a); s.sync()``), the first read of that tensor (``t.numpy()``: "down") and
the first move of it to the other worker (``t.to()``), each beside a warm memcpy of the same
bytes measured in the same run; and, in another fresh cluster, the first read into a buffer
the caller holds, its pages mapped (``t.numpy(out=buffer)``: "down into").

    python bench/first_transfer.py                  # 8, 64, 256 MiB and 1 GiB, 3 runs each
    python bench/first_transfer.py --sizes 8,256 --runs 5

A fresh cluster each run: a worker lends a segment it once offered to a client process to
that process again, so a second session of the same process on the same cluster would find
the first one's pages warm. Prints the medians over the runs, in GB/s and as ratios of the
warm memcpy (``np.copyto`` into a buffer whose pages are already mapped), beside "new
memory": a copy into memory this process has not touched yet, as a first transfer's
receiver has not (faulted in page by page, on as many threads as a worker copies with: the
limit of a first transfer on this machine). Where Ray is installed, its first ``ray.put``
and ``ray.get`` of the same array in a fresh local Ray are timed in the same runs, the get
made the caller's own array as fabric's reads make it: copied into the same warm buffer
("ray down into", the first get), and into a new array (``np.array(ray.get(ref))``: "ray
down", the second get). Last, whether this machine's balloon hands freed memory back to its
host: there new memory faults in at the host's rate or the guest's, by chance, and figures
from 256 MiB up swing with it (``docs/operations.md``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.core import cross_memory  # noqa: E402
from fabric.core.parallel_copy import ParallelCopy  # noqa: E402
from bench.ray_peer import installed as ray_installed  # noqa: E402
from bench.run import w3_fabric  # noqa: E402

MiB = 1 << 20
SETTLE_SECONDS = 1.0  # before each fresh cluster (and Ray): the last one's end (its processes
# exiting, their memory given back) is not timed (first uploads ran 1.5-8 ms at 8 MiB without)


def first_transfers(array: np.ndarray, out: np.ndarray | None = None) -> dict[str, float]:
    """Seconds of the first upload, read (into a new array, or into ``out``) and move of
    ``array`` in a fresh cluster."""
    time.sleep(SETTLE_SECONDS)
    with fabric.LocalCluster(workers=2) as cluster, \
            fabric.connect(cluster.address, token=cluster.token, timeout=120) as session, \
            session.open(1, timeout=120) as other:
        assert session.arange(4).sum().numpy() == 6  # (a warm-up op, as a user's first)
        assert other.arange(4).sum().numpy() == 6
        up, down, tensor = w3_fabric(session, array, out)  # (W3's first round)
        start = time.perf_counter()
        moved = tensor.to(other)
        other.sync()
        to = time.perf_counter() - start
        assert moved[-1].numpy() == array[-1]
        assert session.shares_memory is True, "the shared-memory path was not taken"
        return {"up": up, "down": down, "to": to}


def ray_first(array: np.ndarray, warm: np.ndarray) -> dict[str, float]:
    """Seconds of Ray's first put and get of ``array`` in a fresh local Ray."""
    import ray

    time.sleep(SETTLE_SECONDS)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        start = time.perf_counter()
        ref = ray.put(array)
        up = time.perf_counter() - start
        start = time.perf_counter()
        np.copyto(warm, ray.get(ref))
        down_into = time.perf_counter() - start
        start = time.perf_counter()
        own = np.array(ray.get(ref))
        down = time.perf_counter() - start
        assert own[-1] == array[-1]
        return {"ray up": up, "ray down": down, "ray down into": down_into}
    finally:
        ray.shutdown()


def new_memory(array: np.ndarray) -> float:
    """Seconds of one copy of ``array`` into new memory of this process's
    (``fabric.core.cross_memory.new_array``: what a first transfer writes into, and must
    fault in), on as many threads as a worker copies with: a first transfer's own limit."""
    copies = ParallelCopy()
    try:
        target = cross_memory.new_array(array.shape, array.dtype)
        start = time.perf_counter()
        copies.copy(target, array)
        return time.perf_counter() - start
    finally:
        copies.close()


def memcpy(array: np.ndarray, warm: np.ndarray) -> float:
    """Seconds of one copy of ``array`` into ``warm`` (its pages mapped: the best of 3)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(warm, array)
        times.append(time.perf_counter() - start)
    return min(times)


def free_page_reporting() -> str:
    """Whether this machine's balloon hands freed memory back to its host, which decides how
    fast a first transfer's new memory faults in (``docs/operations.md``)."""
    note = cross_memory.freed_memory_note()
    return "memory: " + (note or "freed memory stays on this machine (no balloon hands it "
                                 "to a host)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256,1024",
                        help="array sizes in MiB, comma separated (default 8,64,256,1024)")
    parser.add_argument("--runs", type=int, default=3, help="fresh clusters per size")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with_ray = ray_installed()
    print(f"first transfers, fresh cluster and session per run; medians of {args.runs} runs; "
          "GB/s (x warm memcpy in the same runs)")
    columns = ["new memory", "up", "down", "down into", "to"] \
        + (["ray up", "ray down", "ray down into"] if with_ray else [])
    print(f"{'size':>9}{'memcpy':>8}" + "".join(f"{name:>17}" for name in columns))
    for size in sizes:
        array = np.random.default_rng(size).random(size * MiB // 8)
        warm = np.ones_like(array)
        figures: dict[str, list[float]] = {}
        for _ in range(args.runs):
            measured: dict[str, Any] = first_transfers(array)
            measured["down into"] = first_transfers(array, warm)["down"]
            if with_ray:
                measured.update(ray_first(array, warm))
            measured["memcpy"] = memcpy(array, warm)
            measured["new memory"] = new_memory(array)
            for name, value in measured.items():
                figures.setdefault(name, []).append(array.nbytes / value / 1e9)
        median = {name: statistics.median(values) for name, values in figures.items()}
        copy = median["memcpy"]
        print(f"{size:>5} MiB{copy:>8.2f}" + "".join(
            f"{median[name]:>9.2f} ({median[name] / copy:.2f}x)" for name in columns))
    print(free_page_reporting())
    if not with_ray:
        print("Ray: not installed here (pip install -e '.[bench]' to time its first put and get "
              "in the same runs)")


if __name__ == "__main__":
    main()
