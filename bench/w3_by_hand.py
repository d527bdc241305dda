"""W3 over the sockets (256 MiB float64 up and back) against a broker and a worker started
by hand (``fabric broker``, ``fabric worker``), as they start by default (re-executed once
with the bulk allocator's GLIBC_TUNABLES) and without those settings, in the same run.

    python bench/w3_by_hand.py        # medians of 5 runs each, GB/s and their ratio
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.raw import BULK_BYTES  # noqa: E402
from bench.run import w3_rates  # noqa: E402
from fabric.launch.local import BULK_MALLOC_STARTED  # noqa: E402

TOKENS = {"FABRIC_TOKEN": "bench-client", "FABRIC_WORKER_TOKEN": "bench-worker"}


def by_hand(env: dict[str, str], array: np.ndarray, runs: int) -> tuple[float, float]:
    """Median GB/s up and down through a broker and worker started with ``env``."""
    command = [sys.executable, "-m", "fabric"]
    broker = subprocess.Popen([*command, "broker", "--frontend", "tcp://127.0.0.1:*",
                               "--worker-address", "tcp://127.0.0.1:*"],
                              env=env, stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        ready = json.loads(broker.stdout.readline())
        worker = subprocess.Popen([*command, "worker", "--broker", ready["workers"],
                                   "--name", "bench"], env=env)
        token = TOKENS["FABRIC_TOKEN"]
        deadline = time.monotonic() + 30
        while not fabric.devices(ready["frontend"], token=token, timeout=5):
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not register")
            time.sleep(0.1)
        with fabric.connect(ready["frontend"], token=token, timeout=60,
                            shared_memory=False) as session:
            figures = [w3_rates(session, array) for _ in range(runs)]
    finally:
        for process in (worker, broker):
            if process is not None:
                process.terminate()
                process.wait(10)
    return (statistics.median(up for up, _ in figures),
            statistics.median(down for _, down in figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    args = parser.parse_args()
    bare = {k: v for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", BULK_MALLOC_STARTED)}
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    plain = by_hand({**bare, **TOKENS, BULK_MALLOC_STARTED: "1"}, array, args.runs)  # no exec
    tuned = by_hand({**bare, **TOKENS}, array, args.runs)
    print(f"W3 over the sockets, 256 MiB float64, by hand; medians of {args.runs} runs, GB/s")
    print(f"{'started':<28}{'up':>8}{'down':>8}")
    print(f"{'without the allocator':<28}{plain[0]:>8.2f}{plain[1]:>8.2f}")
    print(f"{'as fabric starts (re-exec)':<28}{tuned[0]:>8.2f}{tuned[1]:>8.2f}")
    print(f"{'ratio':<28}{tuned[0] / plain[0]:>8.2f}{tuned[1] / plain[1]:>8.2f}")


if __name__ == "__main__":
    main()
