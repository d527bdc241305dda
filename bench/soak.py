"""Soak: clients stream ops while workers are killed and restarted; nothing wrong, hung or left.

    python bench/soak.py --seconds 60 --clients 4

Each client thread (its own connection, as every socket stays in one thread) opens sessions
on random devices and checks every result against numpy. A killer SIGKILLs a random worker
every few seconds and restarts it. Reported: calls done, typed failures by class, wrong
results (must be 0), calls that overran their deadline (must be 0), sessions left on the
devices at the end (must be 0).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402

CALL_TIMEOUT = 5.0
HANG_SLACK = 2.0  # a call that takes longer than its timeout plus this counts as a hang


class Tally:
    """Calls done, typed failures by class, wrong results, and calls that took longer than
    ``hang_after`` seconds (hangs), counted from any thread."""

    def __init__(self, hang_after: float = CALL_TIMEOUT + HANG_SLACK) -> None:
        self.hang_after = hang_after
        self.lock = threading.Lock()
        self.calls = 0
        self.ops = 0
        self.typed: collections.Counter[str] = collections.Counter()
        self.wrong: list[str] = []
        self.hangs = 0
        self.longest = 0.0

    def timed(self, started: float) -> None:
        """A call that began at ``started`` (monotonic) ended, answered or typed."""
        took = time.monotonic() - started
        with self.lock:
            self.calls += 1
            self.longest = max(self.longest, took)
            if took > self.hang_after:
                self.hangs += 1

    def ran(self, ops: int) -> None:
        """``ops`` ops were sent (their result is checked by a call counted with timed)."""
        with self.lock:
            self.ops += ops

    def typed_failure(self, error: Exception) -> None:
        with self.lock:
            self.typed[type(error).__name__] += 1

    def wrong_result(self, what: str) -> None:
        with self.lock:
            self.wrong.append(what)


def client_loop(cluster: fabric.LocalCluster, devices: int, stop: threading.Event,
                tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        started = time.monotonic()
        try:
            with cluster.connect(device=rng.randrange(devices), timeout=CALL_TIMEOUT) as s:
                tally.timed(started)
                for _ in range(rng.randint(1, 20)):
                    n, steps = rng.randint(1, 2000), rng.randint(1, 200)
                    base = np.arange(n, dtype=np.float64)
                    x = s.asarray(base)
                    for k in range(steps):
                        x = x * 1.0 + k
                    tally.ran(2 * steps)
                    started = time.monotonic()
                    got = x.numpy()
                    tally.timed(started)
                    expected = base + steps * (steps - 1) / 2
                    if not np.array_equal(got, expected):
                        tally.wrong_result(f"n={n} steps={steps}")
                    if stop.is_set():
                        break
        except fabric.FabricError as exc:
            tally.timed(started)
            tally.typed_failure(exc)
        except Exception as exc:  # anything untyped is a defect: count it as wrong
            tally.wrong_result(f"{type(exc).__name__}: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=4.0)
    args = parser.parse_args()
    tally, stop = Tally(), threading.Event()
    kills = 0
    with fabric.LocalCluster(workers=args.workers, heartbeat=0.25,
                             broker_args=("--lease", "1.0")) as cluster:
        threads = [threading.Thread(target=client_loop, daemon=True,
                                    args=(cluster, args.workers, stop, tally, i))
                   for i in range(args.clients)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + args.seconds
        rng = random.Random(0)
        while time.monotonic() < deadline:
            time.sleep(min(args.kill_every, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
            victim = rng.randrange(args.workers)
            cluster.workers[victim].send_signal(signal.SIGKILL)
            cluster.workers[victim].wait()
            cluster.start_worker(victim)
            kills += 1
        stop.set()
        for thread in threads:
            thread.join(CALL_TIMEOUT * 3)
        stuck = sum(t.is_alive() for t in threads)
        cluster.wait_for_devices(args.workers, timeout=10)
        left = 0
        for device in range(args.workers):
            with cluster.connect(device=device) as checker:
                left += checker.stats()["device_sessions"] - 1
    print(f"soak: {args.seconds:g} s, {args.clients} clients, {args.workers} workers, "
          f"{kills} worker kills")
    print(f"  calls done: {tally.calls}; ops run: {tally.ops}")
    print(f"  typed failures: {dict(tally.typed) or 0}")
    print(f"  wrong results: {len(tally.wrong)} {tally.wrong[:5]}")
    print(f"  calls past their deadline: {tally.hangs}; client threads stuck: {stuck}")
    print(f"  sessions left on the devices: {left}")
    ok = not tally.wrong and not tally.hangs and not stuck and left == 0
    print("soak: PASS" if ok else "soak: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
