"""Benchmark W6: one array sharded over 1, 2, 4, 8 devices (one worker each), against local numpy
and dask.array with as many workers (threads, and a distributed.LocalCluster of processes), in
one run. dask comes with the bench extra: pip install -e '.[bench]' (without it, dask is left
out of the table).

    python bench/w6_sharded.py                  # 64 MiB of float64, 5 repeats
    python bench/w6_sharded.py --mib 2048 --devices 1 2 4 8 --repeats 3

Two workloads, each timed from the first op to the result read back (the data is drawn on
the devices beforehand, so no upload is timed):
- "chain": 20 elementwise ops on an (n, 512) float64 array, then a full sum;
- "matmul": the (n, 512) array times a replicated (512, 512) one, then a full sum.
dask's array has the same (n // count)-row chunks and is persisted beforehand too; its
weights are a persisted one-chunk dask array. Prints the median seconds and each figure's
ratio to local numpy (above 1: faster). On a machine with fewer cores than devices the
workers share them: the ratios then show the overhead, not the scaling.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.timing import median_seconds  # noqa: E402

COLUMNS = 512
CHAIN = 20
# Seconds a read may wait for the device: a 2 GiB array's op takes tens of seconds on one
# busy core, longer than a session's default (10 s).
READ_TIMEOUT = 600.0


def chain(x: Any) -> Any:
    """20 elementwise ops, alike for numpy, dask and sharded tensors, and a full sum."""
    for step in range(CHAIN // 4):
        x = (x * 1.0001 + step) / 1.5
        x = abs(x) - 0.25
    return x.sum()


def matmul(x: Any, weights: Any) -> Any:
    """``x @ weights``, summed."""
    return (x @ weights).sum()



def on_devices(count: int, rows: int, repeats: int) -> dict[str, float]:
    with fabric.LocalCluster(workers=count) as cluster, \
            cluster.connect(timeout=READ_TIMEOUT) as session:
        mesh = session.mesh(devices=list(range(count)))
        mesh.random.seed(6)
        x = mesh.random.normal(size=(rows, COLUMNS))
        weights = mesh.replicate(np.random.default_rng(6).standard_normal((COLUMNS, COLUMNS)))
        x.sum().numpy()  # (drawn before the clock starts)
        return {"chain": median_seconds(lambda: chain(x).numpy(), repeats),
                "matmul": median_seconds(lambda: matmul(x, weights).numpy(), repeats)}


def local(rows: int, repeats: int) -> dict[str, float]:
    x = np.random.default_rng(6).standard_normal((rows, COLUMNS))
    weights = np.random.default_rng(6).standard_normal((COLUMNS, COLUMNS))
    return {"chain": median_seconds(lambda: chain(x), repeats),
            "matmul": median_seconds(lambda: matmul(x, weights), repeats)}


def dask_scheduler(count: int, processes: bool) -> contextlib.AbstractContextManager[Any]:
    """dask's threaded scheduler with ``count`` threads, or (``processes``) a
    distributed.LocalCluster of ``count`` one-thread workers and its client, as the default."""
    if not processes:
        import dask
        return dask.config.set(scheduler="threads", num_workers=count)
    from distributed import Client, LocalCluster
    stack = contextlib.ExitStack()
    cluster = stack.enter_context(LocalCluster(n_workers=count, threads_per_worker=1,
                                               processes=True, dashboard_address=":0"))
    stack.enter_context(Client(cluster))
    return stack


def with_dask(rows: int, count: int, repeats: int, processes: bool) -> dict[str, float]:
    import dask.array as da
    with dask_scheduler(count, processes):
        x = da.random.default_rng(6).standard_normal(
            (rows, COLUMNS), chunks=(-(-rows // count), COLUMNS)).persist()
        weights = da.from_array(np.random.default_rng(6).standard_normal((COLUMNS, COLUMNS)),
                                chunks=-1).persist()
        x.sum().compute()  # (drawn before the clock starts)
        return {"chain": median_seconds(lambda: chain(x).compute(), repeats),
                "matmul": median_seconds(lambda: matmul(x, weights).compute(), repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="the array's size (float64)")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dask", nargs="+", choices=["threads", "processes"],
                        default=["threads", "processes"],
                        help="dask's schedulers to run beside fabric (processes: slow to start)")
    args = parser.parse_args()
    rows = args.mib * 2**20 // (8 * COLUMNS)
    print(f"W6: ({rows}, {COLUMNS}) float64, {args.mib} MiB; {os.cpu_count()} cores; "
          f"median of {args.repeats}")
    if max(args.devices) > (os.cpu_count() or 1):
        print("(more devices than cores: the workers share them, so the figures show "
              "overhead, not scaling)")
    have_dask = importlib.util.find_spec("distributed") is not None
    if not have_dask:
        print("(dask is not installed: pip install -e '.[bench]' adds it)")
    print(f"{'':24} {'chain s':>9} {'x numpy':>8} {'matmul s':>9} {'x numpy':>8}")
    baseline = local(rows, args.repeats)

    def show(name: str, times: dict[str, float]) -> None:  # each row as soon as measured
        print(f"{name:24} {times['chain']:9.4f} {baseline['chain'] / times['chain']:8.2f} "
              f"{times['matmul']:9.4f} {baseline['matmul'] / times['matmul']:8.2f}", flush=True)

    show("numpy, local", baseline)
    for count in args.devices:
        show(f"fabric, {count} device{'s' * (count > 1)}", on_devices(count, rows, args.repeats))
        for kind in args.dask if have_dask else []:
            show(f"dask, {count} {kind}", with_dask(rows, count, args.repeats,
                                                    kind == "processes"))


if __name__ == "__main__":
    main()
