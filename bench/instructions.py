"""Instructions per W1 op and per W2 read, beside the raw pyzmq peers', under valgrind.

    python bench/instructions.py            # the client; needs valgrind; about two minutes
    python bench/instructions.py --servers  # the broker and worker too; about ten minutes

Wall-clock figures on a shared machine move by a third from one hour to the next; the number
of user-space instructions a thread executes per op does not (within about 1%). Each figure
is the difference between two runs of different lengths, divided by the difference in
iterations, so start-up and the cluster's own work cancel out. Kernel time is not counted.

- The client: only its process runs under valgrind (callgrind, counting only while
  ``builtin_sum`` runs the measured loop); the broker and worker run natively.
- ``--servers``: the broker and the worker each run under valgrind (every thread counted
  apart), fabric's and the raw hop's of ``bench/raw.py``, and a native client drives them.
  The figure is their busiest thread's: the broker's loop, the worker's device thread.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # (run as a script: fabric and bench are found from the root)
WORKLOADS = {  # name: (iterations of the short run, of the long run)
    "w1 fabric": (4000, 8000),
    "w2 fabric": (1000, 2000),
    "w2 raw hop": (1000, 2000),
}


def _loop(workload: str, iterations: int) -> None:
    """Run ``iterations`` of the workload inside ``sum()``, the function callgrind counts in."""
    import numpy as np

    import fabric
    from bench.raw import RawPeers, raw_read

    if workload == "w2 raw hop":
        with RawPeers(True, 27380) as peers:
            payload = np.arange(100.0).tobytes()

            def ping(_: int) -> int:
                raw_read(peers.sock, payload)
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


# -- the broker and worker under valgrind, driven by a native client --------------------------

SERVER_WORKLOADS = {  # name: (iterations of the short run, of the long run)
    "w2 fabric": (300, 1300),
    "w2 raw hop": (300, 1300),
    "w1 fabric": (4000, 12000),
}
_TOKENS = {"FABRIC_TOKEN": "c" * 32, "FABRIC_WORKER_TOKEN": "w" * 32,
           "FABRIC_ADMIN_TOKEN": "a" * 32}


def _under_valgrind(out: str, args: list[str]) -> subprocess.Popen:
    """``python args`` under callgrind, each thread counted in its own ``out-NN`` file."""
    from fabric.launch.local import BULK_MALLOC_STARTED
    # (marked as started with its malloc's settings: a server started by hand otherwise
    # replaces itself with a process that valgrind does not follow, and no thread is counted)
    return subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes",
         f"--callgrind-out-file={out}", sys.executable, *args],
        env={**os.environ, **_TOKENS, "PYTHONPATH": ROOT, BULK_MALLOC_STARTED: "1"}, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _thread_totals(out: str) -> dict[str, int]:
    """Instructions per thread (by valgrind's thread number) of a finished process."""
    totals = {}
    for path in glob.glob(out + "-*"):
        with open(path) as part:
            for line in part:
                if line.startswith("totals:"):
                    totals[path.rsplit("-", 1)[1]] = int(line.split()[1])
    return totals


def _drive_fabric(workload: str, iterations: int, frontend: str) -> None:
    import numpy as np

    import fabric
    deadline = time.monotonic() + 300  # the worker registers slowly under valgrind
    while True:
        try:
            session = fabric.connect(frontend, token=_TOKENS["FABRIC_TOKEN"], timeout=60)
            break
        except fabric.FabricError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    with session:
        x = session.asarray(np.arange(100.0))
        x.numpy()
        for _ in range(iterations):
            if workload == "w1 fabric":
                x = x + 1.0
            else:
                x.numpy()
        x.numpy()


def _drive_raw(iterations: int, frontend: str) -> None:
    import numpy as np
    import zmq

    from bench.raw import raw_read, wait_until_answered
    with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 1000)  # (the last message, "stop", must go out)
        sock.connect(frontend)
        wait_until_answered(sock, timeout=300, every=2.0)  # (slow to start under valgrind)
        payload = np.arange(100.0).tobytes()
        for _ in range(iterations):
            raw_read(sock, payload)
        sock.send(b"stop")  # the raw broker and worker end on it


def _servers_run(workload: str, iterations: int, scratch: str, port: int) -> list[dict[str, int]]:
    """Per-thread instructions of the broker and of the worker over one run."""
    frontend, worker_address = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    slow = ("--heartbeat", "5", "--liveness", "3")  # valgrind is slow: no false losses
    raw = workload == "w2 raw hop"
    if raw:
        starts = [["-c", f"from bench.raw import raw_broker; raw_broker({frontend!r}, "
                         f"{worker_address!r})"],
                  ["-c", "from bench.raw import raw_worker; "
                         f"raw_worker({worker_address!r}, True)"]]
        drive = partial(_drive_raw, iterations, frontend)
    else:
        starts = [["-m", "fabric", "broker", "--frontend", frontend,
                   "--worker-address", worker_address, *slow],
                  ["-m", "fabric", "worker", "--broker", worker_address, "--name", "w0", *slow]]
        drive = partial(_drive_fabric, workload, iterations, frontend)
    outs = [os.path.join(scratch, name) for name in ("broker", "worker")]
    procs = [_under_valgrind(out, start) for out, start in zip(outs, starts)]
    try:
        drive()
        for proc in reversed(procs):
            if not raw:  # (the raw peers ended on "stop")
                proc.send_signal(signal.SIGTERM)
            proc.wait(300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [_thread_totals(out) for out in outs]


def _servers_per_iteration(workload: str, port: int) -> list[float]:
    """The broker's and the worker's busiest thread: instructions per op or read."""
    short, long = SERVER_WORKLOADS[workload]
    runs = []
    for iterations in (short, long):
        with tempfile.TemporaryDirectory() as scratch:
            runs.append(_servers_run(workload, iterations, scratch, port))
    return [max(after.get(t, 0) - before.get(t, 0) for t in after) / (long - short)
            for before, after in zip(*runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--servers", action="store_true",
                        help="also count the broker's and the worker's instructions")
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
    if not args.servers:
        return
    servers = {workload: _servers_per_iteration(workload, 27400 + 10 * i)
               for i, workload in enumerate(SERVER_WORKLOADS)}
    print("broker loop and worker device thread, user-space instructions (callgrind)")
    for index, name in enumerate(("broker", "worker")):
        fabric_w2, raw_w2 = servers["w2 fabric"][index], servers["w2 raw hop"][index]
        print(f"W2 per read  {name} fabric {fabric_w2:>9,.0f}   raw hop {raw_w2:>9,.0f}"
              f"   {fabric_w2 / raw_w2:.2f}x")
    # (The broker forwards a W1 batch of hundreds of ops at once: its share per op is lost in
    # its timers' own work, so only the worker's is shown.)
    print(f"W1 per op    worker fabric {servers['w1 fabric'][1]:>9,.0f}")


if __name__ == "__main__":
    main()
