"""Small moves worker to worker (``t.to()``): how long one waits, beside the raw hop's round
trip measured in the same run.

    python bench/moves.py              # medians of 5 interleaved runs of 300 moves each
    python bench/moves.py --kib 1 64 65 --runs 3

A move of a 1 KiB tensor between two workers is three messages from the client (the
receiving device's agreement, the sending device's send, and the wait for the tensor) and
the TRANSFER between the workers; one whose TRANSFER is small (at most
``fabric.core.flow.EARLY_TRANSFER_BYTES``, or its bytes by memory or a slot) waits for one
answer, a larger one whose bytes travel in the TRANSFER for two (``fabric.transport.moves``).
The raw hop's round trip (``bench/raw.py``: a DEALER, the minimal Python broker, a worker) is
the limit of one answer. Each size's moves alternate with the raw round trips, run after run.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.raw import RawPeers  # noqa: E402
from bench.run import percentiles, w2_raw  # noqa: E402
from bench.timing import seconds  # noqa: E402

MOVES = 300


def moves(source: fabric.Tensor, target: fabric.Session) -> list[float]:
    """The seconds each of ``MOVES`` moves of ``source`` to ``target`` took (each moved
    tensor let go at once: freed on its device with the next move's messages)."""
    return [seconds(lambda: source.to(target)) for _ in range(MOVES)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, nargs="+", default=[1, 65],
                        help="tensor sizes in KiB [default: 1 and 65, either side of the "
                        "bound on a TRANSFER sent before its agreement]")
    parser.add_argument("--runs", type=int, default=5, help="repetitions, interleaved")
    parser.add_argument("--port", type=int, default=27320, help="the raw hop's two ports")
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    with RawPeers(True, args.port) as hop, fabric.LocalCluster(workers=2) as cluster, \
            fabric.connect(cluster.address, token=cluster.token, timeout=60,
                           shared_memory=False) as here, here.open(1, timeout=60) as there:
        sources = {kib: here.asarray(np.ones(kib * 1024 // 8)) for kib in args.kib}
        here.sync()
        for _ in range(args.runs):
            times.setdefault("hop", []).extend(w2_raw(hop, MOVES))
            for kib, source in sources.items():
                times.setdefault(f"{kib} KiB", []).extend(moves(source, there))
    hop_p50 = percentiles(times["hop"])[0]
    print(f"t.to() between two workers, no shared memory, {args.runs} runs of {MOVES}: "
          "p50 and p99 in µs, p50 in raw hop round trips (the same run)")
    for name, values in times.items():
        p50, p99 = percentiles(values)
        print(f"{name:>8}  p50 {p50:7.0f}  p99 {p99:7.0f}  {p50 / hop_p50:5.2f}x hop round trip")


if __name__ == "__main__":
    main()
