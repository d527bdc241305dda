"""Benchmarks W1-W3: fabric figures beside raw pyzmq measured in the same run.

    python bench/run.py            # all, prints a table of medians and ratios
    python bench/run.py --scrape-hz 10   # the same while /metrics is scraped 10 times a second

Raw baselines: "direct" is a DEALER talking to a ROUTER worker; "hop" puts the minimal Python
broker of ``bench/raw.py`` between them, which is the path fabric's traffic takes. The raw
processes run with the allocator settings fabric's own get (``with_bulk_malloc``).
"""

from __future__ import annotations

import argparse
import os
import contextlib
import statistics
import subprocess
import sys
import time
from typing import Iterator
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.launch.local import with_bulk_malloc  # noqa: E402
from bench.raw import BULK_BYTES, RawPeers, raw_read  # noqa: E402
from bench.timing import seconds  # noqa: E402

W1_OPS = 10_000
W2_READS = 2_000


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

def w2_fabric(session: fabric.Session, reads: int = W2_READS) -> list[float]:
    """The seconds each of ``reads`` sequential reads of a 100-element tensor took."""
    x = session.asarray(np.arange(100.0))
    x.numpy()
    return [seconds(x.numpy) for _ in range(reads)]


def w2_raw(peers: RawPeers, reads: int = W2_READS) -> list[float]:
    """The seconds each of ``reads`` raw round trips of 800 bytes took."""
    payload = np.arange(100.0).tobytes()
    return [seconds(lambda: raw_read(peers.sock, payload)) for _ in range(reads)]


def percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return (ordered[len(ordered) // 2] * 1e6, ordered[int(len(ordered) * 0.99)] * 1e6)


# -- W3: 256 MiB float64 up and back ----------------------------------------------------------

def w3_fabric(session: fabric.Session, array: np.ndarray, out: np.ndarray | None = None) \
        -> tuple[float, float, fabric.Tensor]:
    """Seconds of one upload of ``array`` (``asarray``, then ``sync``) and of the read of it
    back (``numpy()``, into an array dropped before this returns, or into ``out``), and the
    tensor uploaded."""
    start = time.perf_counter()
    tensor = session.asarray(array)
    session.sync()
    up = time.perf_counter() - start
    start = time.perf_counter()
    back = tensor.numpy(out=out)
    down = time.perf_counter() - start
    assert back.nbytes == array.nbytes and back[-1] == array[-1]
    return up, down, tensor


def w3_rates(session: fabric.Session, array: np.ndarray) -> tuple[float, float]:
    """GB/s of one upload of ``array`` and of the read of it back (``w3_fabric``), the
    tensor freed (and the device's copy with it) before this returns."""
    up, down, tensor = w3_fabric(session, array)
    del tensor
    session.sync()
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


# A scraper in its own process (not a thread of the client being measured), reading /metrics
# at a fixed rate until ended.
_SCRAPER = """
import sys, time, urllib.request
url, period = sys.argv[1], 1 / float(sys.argv[2])
while True:
    urllib.request.urlopen(url, timeout=5).read()
    time.sleep(period)
"""


@contextlib.contextmanager
def scraping(url: str | None, hz: float) -> Iterator[None]:
    """Scrape ``url`` ``hz`` times a second while inside (nothing when hz is 0)."""
    if not hz or url is None:
        yield
        return
    scraper = subprocess.Popen([sys.executable, "-c", _SCRAPER, url, str(hz)])
    try:
        yield
    finally:
        scraper.terminate()
        scraper.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--port", type=int, default=27310,
                        help="first of 4 loopback ports (below the ephemeral range, where "
                        "a closed connection's port can stay taken for a minute)")
    parser.add_argument("--skip-bulk", action="store_true", help="skip W3 (256 MiB)")
    parser.add_argument("--scrape-hz", type=float, default=0.0,
                        help="serve the broker's Prometheus metrics and scrape them this many "
                        "times a second throughout [default: not served]")
    args = parser.parse_args()
    # The raw peers' processes get the allocator settings LocalCluster gives fabric's broker
    # and worker (freed memory kept for the next large frame, on huge pages): like for like.
    # (This process, the client of both, started with whatever its environment said.)
    os.environ.update(with_bulk_malloc(os.environ))
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    figures: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    # The three systems run side by side and are measured in turn, run after run, so that a
    # noisy neighbour slows all of them alike and the ratios stay meaningful.
    with RawPeers(False, args.port) as direct, RawPeers(True, args.port + 2) as hop, \
            fabric.LocalCluster(workers=1, broker_args=(
                ("--metrics", "127.0.0.1:0") if args.scrape_hz else ())) as cluster, \
            cluster.connect(timeout=60) as session, scraping(cluster.metrics_url,
                                                             args.scrape_hz):
        systems = {"direct": direct, "hop": hop}
        for _ in range(args.runs):
            for name, peers in systems.items():
                note(f"w1 {name}", w1_raw(peers))
            note("w1 fabric", w1_fabric(session))
            for name, peers in systems.items():
                figures.setdefault(f"w2 {name}", []).extend(w2_raw(peers))
            figures.setdefault("w2 fabric", []).extend(w2_fabric(session))
            if not args.skip_bulk:
                for name, peers in systems.items():
                    up, down = w3_raw(peers, array)
                    note(f"w3 up {name}", up)
                    note(f"w3 down {name}", down)
                up, down = w3_rates(session, array)  # (the next run starts with the
                # worker's copy freed)
                note("w3 up fabric", up)
                note("w3 down fabric", down)

    median = {name: statistics.median(values) for name, values in figures.items()}
    rows = [("W1 ops/s", *(f"{median[f'w1 {s}']:,.0f}" for s in ("fabric", "direct", "hop")),
             f"{median['w1 fabric'] / median['w1 hop']:.2f}x hop msg rate")]
    for label, index in (("p50", 0), ("p99", 1)):
        p = {s: percentiles(figures[f"w2 {s}"])[index] for s in ("fabric", "direct", "hop")}
        rows.append((f"W2 read {label} µs", *(f"{p[s]:.0f}" for s in ("fabric", "direct", "hop")),
                     f"{p['fabric'] / p['hop']:.2f}x hop"))
    if not args.skip_bulk:
        for way in ("up", "down"):
            m = {s: median[f"w3 {way} {s}"] for s in ("fabric", "direct", "hop")}
            rows.append((f"W3 {way} GB/s", *(f"{m[s]:.2f}" for s in ("fabric", "direct", "hop")),
                         f"{m['fabric'] / m['hop']:.2f}x hop"))
    header = ("figure", "fabric", "raw direct", "raw hop", "ratio")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    print(f"medians of {args.runs} interleaved runs"
          + (f", /metrics scraped {args.scrape_hz:g} times a second" if args.scrape_hz else ""))
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


if __name__ == "__main__":
    main()
