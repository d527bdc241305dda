"""The CPU one /metrics scrape costs the broker's process, with and without device reports.

    python bench/scrape_cost.py              # 4 workers of 2 devices
    python bench/scrape_cost.py --workers 16 --devices 4

A scrape runs in prometheus_client's own thread of the broker's process, sharing the GIL
with the routing loop: what it costs is time the loop may wait. This builds a registry (sans
I/O) with that many workers, one open session on each device and, the second time, a
heartbeat report from each worker, and times prometheus_client's ``generate_latest`` of the
broker's collector over one snapshot: the median of many scrapes, and what scraping 10 times
a second costs as a share of one core. ``bench/run.py --scrape-hz 10`` shows its effect on
W1 and W2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client.exposition import generate_latest  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402

from fabric.broker.metrics import FabricCollector, figures  # noqa: E402
from fabric.broker.registry import Registry  # noqa: E402
from fabric.core import protocol  # noqa: E402
from fabric.core.protocol import (OP_SECONDS_BUCKETS, DeviceReport, Kind, Message,  # noqa: E402
                                  WorkerReport)

_TOKEN, _WORKER_TOKEN = "c" * 32, "w" * 32


def _registry(workers: int, devices: int, reported: bool) -> Registry:
    registry = Registry(client_token=_TOKEN, worker_token=_WORKER_TOKEN)
    for w in range(workers):
        identity = b"worker-%d" % w
        registry.from_worker(identity, protocol.encode(Message(Kind.REGISTER, body={
            "token": _WORKER_TOKEN, "name": f"worker-{w}", "backend": "numpy",
            "devices": [{}] * devices})), 0.0)
        if reported:
            device = DeviceReport(1 << 20, tuple(range(len(OP_SECONDS_BUCKETS) + 1)), 1.5, 3, 1,
                                  0)
            registry.from_worker(identity, protocol.encode(Message(
                Kind.HEARTBEAT, body=protocol.report_body(WorkerReport(1 << 30,
                                                                       (device,) * devices)))),
                0.1)
    for index in range(workers * devices):  # a session on each device
        registry.from_client(b"client", protocol.encode(Message(
            Kind.HELLO, index + 1, 1, {"token": _TOKEN, "device": index})), 0.2)
    return registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--devices", type=int, default=2, help="devices per worker")
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    collectors = {}
    for reported in (False, True):
        snapshot = figures(_registry(args.workers, args.devices, reported), 1.0, held=0)
        collectors[reported] = CollectorRegistry(auto_describe=False)
        collectors[reported].register(FabricCollector(lambda snapshot=snapshot: snapshot))
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.scrapes):  # interleaved, so a noisy neighbour slows both alike
        for reported, collector in collectors.items():
            start = time.perf_counter()
            generate_latest(collector)
            times[reported].append(time.perf_counter() - start)
    print(f"{args.workers} workers x {args.devices} devices, median of {args.scrapes} scrapes")
    for reported, collector in collectors.items():
        text = generate_latest(collector).decode()
        samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        median = statistics.median(times[reported])
        print(f"  device reports {'on ' if reported else 'off'}  {samples:5d} samples  "
              f"{median * 1e6:8,.0f} µs a scrape  {median * 10:6.1%} of a core at 10 Hz")
    print(f"  ratio on/off {statistics.median(times[True]) / statistics.median(times[False]):.2f}x")


if __name__ == "__main__":
    main()
