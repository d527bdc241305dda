"""Benchmark: where a reduction across the split axis should combine when a further op needs
it on the devices, as in ``y - y.sum(axis=0)``.

    python bench/w6_combine.py                      # 4 devices, partials of 4 KiB to 8 MiB

- "client": every shard's partial sum is read (in parallel), summed on the client, and the
  sum uploaded to each device;
- "device": the partials move worker to worker (``Tensor.to``) to the first device, are summed
  there, and the sum moves to each other device: nothing crosses the client.
Each is timed from the op to the centred array's full sum read back; the median of the
repeats, and device / client (above 1: the device path is slower). fabric takes the client
path: on one host, where shared memory carries the large reads and uploads, the device path
was slower here below 4 MiB partials and in and out of noise above (each move is two
round trips, one after another).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.timing import median_seconds  # noqa: E402
from fabric.mesh.sharded import ShardedTensor  # noqa: E402

ROWS_PER_DEVICE = 8



def on_the_client(y: ShardedTensor) -> float:
    return float((y - y.mesh.replicate(y.sum(axis=0).numpy())).sum().numpy())


def on_a_device(y: ShardedTensor) -> float:
    sessions = y.mesh.sessions
    partials = [shard.sum(axis=0) for _, shard in y.shards]
    total = np.stack([partials[0]] + [p.to(sessions[0]) for p in partials[1:]]).sum(axis=0)
    summed = ShardedTensor(y.mesh, [total] + [total.to(s) for s in sessions[1:]], None)
    return float((y - summed).sum().numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--columns", type=int, nargs="+", default=[512, 2**17, 2**20])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.devices} devices, {ROWS_PER_DEVICE} rows each; {os.cpu_count()} cores; "
          f"median of {args.repeats}")
    print(f"{'partial':>10} {'client s':>9} {'device s':>9} {'device/client':>14}")
    with fabric.LocalCluster(workers=args.devices) as cluster, cluster.connect() as session:
        mesh = session.mesh(devices=list(range(args.devices)))
        for columns in args.columns:
            y = mesh.random.normal(size=(ROWS_PER_DEVICE * args.devices, columns))
            assert np.isclose(on_the_client(y), on_a_device(y))
            client = median_seconds(lambda: on_the_client(y), args.repeats)
            device = median_seconds(lambda: on_a_device(y), args.repeats)
            print(f"{columns * 8 // 1024:>7} KiB {client:9.4f} {device:9.4f} "
                  f"{device / client:14.2f}")


if __name__ == "__main__":
    main()
