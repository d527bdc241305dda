"""How long a cluster takes to start with its workers on other hosts over SSH: 2 simulated
hosts (network namespaces running sshd, ``tests/simhosts.py``; root and openssh-server
needed) x 2 workers, against the same 4 workers started on this machine.

    python bench/ssh_launch.py [--repeats R] [--hosts H] [--workers-per-host W]

Each figure is the median, over R launches, of the wall time from the start of ``start()`` to
every device registered (the broker's start included), and the time to stop everything; the
ratio of the SSH launch to the local one is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import simhosts  # noqa: E402

from fabric import LocalCluster  # noqa: E402
from fabric.launch.ssh import SSHCluster, parse_hosts  # noqa: E402


def timed(make, repeats: int) -> tuple[float, float]:
    """Median seconds to start the cluster ``make()`` returns, and to stop it."""
    starts, stops = [], []
    for _ in range(repeats):
        cluster = make()
        began = time.perf_counter()
        cluster.start()
        starts.append(time.perf_counter() - began)
        began = time.perf_counter()
        cluster.__exit__()
        stops.append(time.perf_counter() - began)
    return statistics.median(starts), statistics.median(stops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers-per-host", type=int, default=2)
    options = parser.parse_args()
    reason = simhosts.missing()
    if reason:
        sys.exit(f"bench/ssh_launch.py: {reason}")
    workers = options.hosts * options.workers_per_host
    with tempfile.TemporaryDirectory() as work, \
            simhosts.simulated_hosts(Path(work), options.hosts) as hosts:
        over_ssh = timed(lambda: SSHCluster(
            parse_hosts(",".join(hosts.addresses)), workers_per_host=options.workers_per_host,
            remote_python=sys.executable, ssh_config=str(hosts.ssh_config),
            worker_address="tcp://0.0.0.0:*", advertise=hosts.bridge_address),
            options.repeats)
        here = timed(lambda: LocalCluster(workers), options.repeats)
    print(f"{options.hosts} hosts x {options.workers_per_host} workers over ssh: start "
          f"{over_ssh[0]:.2f} s, stop {over_ssh[1]:.2f} s (median of {options.repeats})")
    print(f"{workers} workers on this machine:      start {here[0]:.2f} s, stop "
          f"{here[1]:.2f} s")
    print(f"ssh / local start: {over_ssh[0] / here[0]:.2f}x")


if __name__ == "__main__":
    main()
