"""W1 and W2 through a broker that has a peer, beside a single broker, in the same run.

    python bench/pair_data_path.py --rounds 5

Two clusters of one worker each run side by side: a single broker, and a broker pair
(``LocalCluster(standby=True)``; the client goes through its active broker). Each round runs
W1 (10,000 ``x = x + 1.0`` on a 100-element tensor, one read; ops per second) and W2 (2,000
sequential reads of a 100-element tensor; median seconds) on both, alternating which goes
first. Printed: each figure's median over the rounds and the pair's ratio to the single
broker (the issue asks for the pair within 3%: the pair is asked only at HELLO, DEVICES and
REGISTER, never per routed message).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.run import w1_fabric, w2_fabric  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {"single": {"w1": [], "w2": []},
                                                  "pair": {"w1": [], "w2": []}}
    with fabric.LocalCluster(workers=1) as single, \
            fabric.LocalCluster(workers=1, standby=True) as pair:
        clusters = {"single": single, "pair": pair}
        for round_ in range(args.rounds):
            order = ["single", "pair"] if round_ % 2 == 0 else ["pair", "single"]
            for name in order:
                with clusters[name].connect(timeout=10) as session:
                    figures[name]["w1"].append(w1_fabric(session))
                    figures[name]["w2"].append(statistics.median(w2_fabric(session)))
    w1 = {name: statistics.median(f["w1"]) for name, f in figures.items()}
    w2 = {name: statistics.median(f["w2"]) for name, f in figures.items()}
    print(f"W1 ops/s: single {w1['single']:.0f}, pair {w1['pair']:.0f}; "
          f"pair/single {w1['pair'] / w1['single']:.3f} (higher is better)")
    print(f"W2 read median: single {w2['single'] * 1e6:.0f} us, pair {w2['pair'] * 1e6:.0f} us; "
          f"pair/single {w2['pair'] / w2['single']:.3f} (lower is better)")


if __name__ == "__main__":
    main()
