"""Client instructions per W1 op and per W2 read, beside the raw pyzmq client's, under valgrind.

    python bench/instructions.py        # needs valgrind; takes about two minutes

Wall-clock figures on a shared machine move by a third from one hour to the next; the number
of user-space instructions the client's thread executes per op does not (within about 1%).
Each figure is the difference between two runs of different lengths, divided by the
difference in iterations, so start-up and the cluster's own work cancel out. Only the client
process runs under valgrind (callgrind, counting only while ``builtin_sum`` runs the
measured loop); the broker and worker run natively. Kernel time is not counted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {  # name: (iterations of the short run, of the long run)
    "w1 fabric": (4000, 8000),
    "w2 fabric": (1000, 2000),
    "w2 raw hop": (1000, 2000),
}


def _loop(workload: str, iterations: int) -> None:
    """Run ``iterations`` of the workload inside ``sum()``, the function callgrind counts in."""
    sys.path.insert(0, ROOT)
    import numpy as np

    import fabric
    from bench.raw import RawPeers

    if workload == "w2 raw hop":
        with RawPeers(True, 27380) as peers:
            payload = np.arange(100.0).tobytes()

            def ping(_: int) -> int:
                peers.sock.send_multipart([b"ping", payload])
                frames = peers.sock.recv_multipart(copy=False)
                np.frombuffer(frames[0].buffer, dtype=np.float64).copy()
                return 0
            sum(map(ping, range(iterations)))
        return
    with fabric.LocalCluster(workers=1) as cluster, cluster.connect(timeout=300) as session:
        if workload == "w1 fabric":
            state = {"x": session.zeros(100)}

            def step(_: int) -> int:
                state["x"] = state["x"] + 1.0
                return 0
        else:
            x = session.asarray(np.arange(100.0))

            def step(_: int) -> int:
                x.numpy()
                return 0
        session.sync()
        sum(map(step, range(iterations)))
        session.sync()


def _count(workload: str, iterations: int, attempts: int = 3) -> int:
    """Instructions the client's main thread ran in the loop (a run valgrind slowed so much
    that the connection was dropped is tried again)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "callgrind.out")
        for _ in range(attempts):
            run = subprocess.run(
                ["valgrind", "--tool=callgrind", "--separate-threads=yes",
                 "--collect-atstart=no", "--toggle-collect=builtin_sum",
                 f"--callgrind-out-file={out}", sys.executable, __file__, "--loop", workload,
                 str(iterations)], capture_output=True, text=True, timeout=600)
            if run.returncode == 0:
                with open(out + "-01") as main_thread:
                    for line in main_thread:
                        if line.startswith("totals:"):
                            return int(line.split()[1])
        raise RuntimeError(f"{workload} failed under valgrind: {run.stderr[-500:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        _loop(args.loop[0], int(args.loop[1]))
        return
    per: dict[str, float] = {}
    for workload, (short, long) in WORKLOADS.items():
        per[workload] = (_count(workload, long) - _count(workload, short)) / (long - short)
    print("client main thread, user-space instructions (callgrind)")
    print(f"W1 per op    fabric {per['w1 fabric']:>9,.0f}")
    print(f"W2 per read  fabric {per['w2 fabric']:>9,.0f}   raw hop {per['w2 raw hop']:>9,.0f}"
          f"   {per['w2 fabric'] / per['w2 raw hop']:.2f}x")


if __name__ == "__main__":
    main()
