"""What a watched dashboard costs the broker: one snapshot with and without its detail.

    python bench/dashboard_cost.py                   # 2 workers of 2 devices, 1000 sessions
    python bench/dashboard_cost.py --sessions 10000

The broker's loop publishes a snapshot every 0.25 s while --metrics is on; while a dashboard
has asked for data in the last 10 s the snapshot also lists the oldest sessions (200 at most)
and the lost workers. This builds a registry (sans I/O) with that many sessions and times
``figures`` without and with that detail (the loop's cost, shared with routing), and the
dashboard's JSON of a snapshot (an HTTP thread's, sharing the GIL): medians, and the share of
one core at 4 publishes and 1 poll a second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fabric.broker.dashboard import data  # noqa: E402
from fabric.broker.metrics import figures  # noqa: E402
from fabric.broker.model import Limits  # noqa: E402
from fabric.broker.registry import Registry  # noqa: E402
from fabric.core import protocol  # noqa: E402
from fabric.core.protocol import Kind, Message  # noqa: E402

_TOKEN, _WORKER_TOKEN = "c" * 32, "w" * 32


def _registry(workers: int, devices: int, sessions: int) -> Registry:
    many = 10 * sessions + 10  # (limits out of the way: this measures the snapshot)
    registry = Registry(client_token=_TOKEN, worker_token=_WORKER_TOKEN, limits=Limits(
        max_sessions_per_device=many, max_sessions_per_client=many, max_sessions_per_token=many))
    for w in range(workers):
        registry.from_worker(b"worker-%d" % w, protocol.encode(Message(Kind.REGISTER, body={
            "token": _WORKER_TOKEN, "name": f"worker-{w}", "backend": "numpy",
            "devices": [{}] * devices})), 0.0)
    for number in range(sessions):
        registry.from_client(b"client-%d" % (number % 64), protocol.encode(Message(
            Kind.HELLO, number + 1, 1, {"token": _TOKEN,
                                        "device": number % (workers * devices)})), 0.2)
    return registry


def _medians(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each call's median time, the calls interleaved (a noisy neighbour slows all alike)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="devices per worker")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    registry = _registry(args.workers, args.devices, args.sessions)
    assert len(registry.sessions) == args.sessions, len(registry.sessions)
    snapshot = figures(registry, 1.0, 0, detail=True)
    medians = _medians({"plain": lambda: figures(registry, 1.0, 0),
                        "detail": lambda: figures(registry, 1.0, 0, detail=True),
                        "answer": lambda: json.dumps(data(snapshot))}, args.repeats)
    plain, detail, answer = medians["plain"], medians["detail"], medians["answer"]
    print(f"{args.workers} workers x {args.devices} devices, {args.sessions} sessions, "
          f"median of {args.repeats}")
    print(f"  snapshot, unwatched  {plain * 1e6:8,.0f} µs  {plain * 4:6.2%} of a core at 4 Hz")
    print(f"  snapshot, watched    {detail * 1e6:8,.0f} µs  {detail * 4:6.2%} of a core at 4 Hz")
    print(f"  dashboard JSON       {answer * 1e6:8,.0f} µs  {answer:6.2%} of a core at 1 Hz")
    print(f"  ratio watched/unwatched {detail / plain:.2f}x")


if __name__ == "__main__":
    main()
