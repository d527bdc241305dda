"""Benchmarks W1-W3: fabric figures beside raw pyzmq measured in the same run.

    python bench/run.py            # all, prints a table of medians and ratios

Raw baselines: "direct" is a DEALER talking to a ROUTER worker; "hop" puts the minimal Python
broker of ``bench/raw.py`` between them, which is the path fabric's traffic takes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.raw import BULK_BYTES, RawPeers  # noqa: E402

W1_OPS = 10_000
W2_READS = 2_000


def median_of(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


# -- W1: 10,000 x = x + 1.0 on a 100-element tensor, one read ---------------------------------

def w1_fabric(session: fabric.Session) -> float:
    x = session.zeros(100)
    start = time.perf_counter()
    for _ in range(W1_OPS):
        x = x + 1.0
    result = x.numpy()
    elapsed = time.perf_counter() - start
    assert result[0] == W1_OPS
    return W1_OPS / elapsed


def w1_raw(peers: RawPeers) -> float:
    payload = np.zeros(100).tobytes()
    start = time.perf_counter()
    for _ in range(W1_OPS):
        peers.sock.send_multipart([b"sink", payload])
    peers.sock.send_multipart([b"sync"])
    peers.sock.recv_multipart()
    return W1_OPS / (time.perf_counter() - start)


# -- W2: 2,000 sequential reads of a 100-element tensor -------------------------------------

def w2_fabric(session: fabric.Session) -> list[float]:
    x = session.asarray(np.arange(100.0))
    x.numpy()
    times = []
    for _ in range(W2_READS):
        start = time.perf_counter()
        x.numpy()
        times.append(time.perf_counter() - start)
    return times


def w2_raw(peers: RawPeers) -> list[float]:
    payload = np.arange(100.0).tobytes()
    times = []
    for _ in range(W2_READS):
        start = time.perf_counter()
        peers.sock.send_multipart([b"ping", payload])
        frames = peers.sock.recv_multipart(copy=False)
        np.frombuffer(frames[0].buffer, dtype=np.float64).copy()
        times.append(time.perf_counter() - start)
    return times


def percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return (ordered[len(ordered) // 2] * 1e6, ordered[int(len(ordered) * 0.99)] * 1e6)


# -- W3: 256 MiB float64 up and back ----------------------------------------------------------

def w3_fabric(session: fabric.Session, array: np.ndarray) -> tuple[float, float]:
    start = time.perf_counter()
    tensor = session.asarray(array)
    session.sync()
    up = time.perf_counter() - start
    start = time.perf_counter()
    back = tensor.numpy()
    down = time.perf_counter() - start
    assert back.nbytes == array.nbytes and back[-1] == array[-1]
    return array.nbytes / up / 1e9, array.nbytes / down / 1e9


def w3_raw(peers: RawPeers, array: np.ndarray) -> tuple[float, float]:
    start = time.perf_counter()
    peers.sock.send_multipart([b"bulk-put", array], copy=False)
    peers.sock.recv_multipart()
    up = time.perf_counter() - start
    start = time.perf_counter()
    peers.sock.send(b"bulk-get")
    frames = peers.sock.recv_multipart(copy=False)
    np.frombuffer(frames[0].buffer, dtype=np.float64)
    down = time.perf_counter() - start
    return BULK_BYTES / up / 1e9, BULK_BYTES / down / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--port", type=int, default=47310, help="first of 4 loopback ports")
    parser.add_argument("--skip-bulk", action="store_true", help="skip W3 (256 MiB)")
    args = parser.parse_args()
    runs = args.runs
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    rows: list[tuple[str, str, str, str, str]] = []

    raw: dict[str, dict[str, float]] = {}
    for name, hop, port in [("direct", False, args.port), ("hop", True, args.port + 2)]:
        with RawPeers(hop, port) as peers:
            w2 = [t for _ in range(runs) for t in w2_raw(peers)]
            raw[name] = {"w1": median_of(runs, lambda: w1_raw(peers)),
                         "w2_p50": percentiles(w2)[0], "w2_p99": percentiles(w2)[1]}
            if not args.skip_bulk:
                bulk = [w3_raw(peers, array) for _ in range(max(1, runs // 2))]
                raw[name]["w3_up"] = statistics.median(b[0] for b in bulk)
                raw[name]["w3_down"] = statistics.median(b[1] for b in bulk)

    with fabric.LocalCluster(workers=1) as cluster, cluster.connect(timeout=60) as session:
        w1 = median_of(runs, lambda: w1_fabric(session))
        w2 = [t for _ in range(runs) for t in w2_fabric(session)]
        p50, p99 = percentiles(w2)
        rows.append(("W1 ops/s", f"{w1:,.0f}", f"{raw['direct']['w1']:,.0f}",
                     f"{raw['hop']['w1']:,.0f}", f"{w1 / raw['hop']['w1']:.2f}x hop msg rate"))
        rows.append(("W2 read p50 µs", f"{p50:.0f}", f"{raw['direct']['w2_p50']:.0f}",
                     f"{raw['hop']['w2_p50']:.0f}", f"{p50 / raw['hop']['w2_p50']:.2f}x hop"))
        rows.append(("W2 read p99 µs", f"{p99:.0f}", f"{raw['direct']['w2_p99']:.0f}",
                     f"{raw['hop']['w2_p99']:.0f}", f"{p99 / raw['hop']['w2_p99']:.2f}x hop"))
        if not args.skip_bulk:
            bulk = [w3_fabric(session, array) for _ in range(max(1, runs // 2))]
            for i, way in enumerate(["up", "down"]):
                value = statistics.median(b[i] for b in bulk)
                rows.append((f"W3 {way} GB/s", f"{value:.2f}", f"{raw['direct'][f'w3_{way}']:.2f}",
                             f"{raw['hop'][f'w3_{way}']:.2f}",
                             f"{value / raw['hop'][f'w3_{way}']:.2f}x hop"))

    header = ("figure", "fabric", "raw direct", "raw hop", "ratio")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


if __name__ == "__main__":
    main()
