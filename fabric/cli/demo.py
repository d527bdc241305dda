"""The README's demo: a real workload on an embedded local cluster, told as it runs."""

from __future__ import annotations

import time

import numpy as np

from fabric.launch.local import LocalCluster


def run(workers: int = 2) -> None:
    """Start a local broker and ``workers`` workers, compute across two devices, stop."""
    started = time.monotonic()
    with LocalCluster(workers=workers) as cluster:
        print(f"local cluster up in {time.monotonic() - started:.2f} s: broker at "
              f"{cluster.address}")
        for device in cluster.devices():
            print(f"  device {device.index}: {device.backend} {device.settings.get('version')} "
                  f"on {device.worker}")
        with cluster.connect(device=0) as first, first.open(device=1 % workers) as second:
            data = np.random.default_rng(0).random((400, 400))
            x = first.asarray(data)
            print(f"uploaded a {data.shape} float64 array ({data.nbytes / 1e6:.1f} MB) to "
                  f"device {first.device.index}")
            expected = data
            for _ in range(150):  # 300 ops, streamed in batches, nothing read back yet
                x = x * 0.99 + 0.005
                expected = expected * 0.99 + 0.005
            moved = x.to(second)
            print(f"streamed 300 ops on device {first.device.index}, moved the result to "
                  f"device {second.device.index} worker to worker")
            gram = (moved @ moved.T).sum(axis=0)
            print(f"  on device {second.device.index}: (x @ x.T).sum(axis=0) -> shape "
                  f"{gram.shape} {gram.dtype}, known before any read")
            result = gram.numpy()
            reference = (expected @ expected.T).sum(axis=0)
            print(f"read back {result.nbytes} bytes; matches local numpy: "
                  f"{np.allclose(result, reference)}")
            counts = ", ".join(f"{k} {v}" for k, v in first.stats().items() if v)
            print(f"device {first.device.index} session stats: {counts}")
        with cluster.admin() as admin:
            status = admin.status()
        traffic = status["traffic"]
        print(f"admin status: {status['workers']} workers, {status['devices_online']} devices "
              f"online, up {status['uptime']:.1f} s, {status['sessions']} sessions open, "
              f"{status['sessions_ended']} ended; traffic {traffic}")
    print("cluster stopped; no process left behind")
