"""The README's demo: a local cluster, its devices, a session on each."""

from __future__ import annotations

import time

from .cluster import LocalCluster


def run(workers: int = 2) -> None:
    """Start a local broker and ``workers`` workers, then use every device once."""
    started = time.monotonic()
    with LocalCluster(workers=workers) as cluster:
        print(f"local cluster up in {time.monotonic() - started:.2f} s: broker at "
              f"{cluster.address}")
        for device in cluster.devices():
            print(f"  device {device.index}: {device.backend} on {device.worker} "
                  f"(numpy {device.settings.get('version')})")
        for device in cluster.devices():
            with cluster.connect(device=device.index) as session:
                session.sync()
                print(f"  opened, synced and closed {session!r}")
    print("cluster stopped; no process left behind")
