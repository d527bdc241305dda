"""Where a W2 read's time goes: each process's part and each hop's, fabric beside raw pyzmq.

    python bench/hops.py            # 3 rounds of 2,000 reads each way; prints medians

Every process on the way (client, broker, worker; fabric's and the raw hop's of
``bench/raw.py``) notes the time when a message has been received and when one has been
sent, on the machine's monotonic clock, which all processes share. For each read the
notes that fall inside it give nine parts: the client before its send, the way to the
broker, the broker forwarding the request, the way to the worker, the worker answering,
and so on back. "The way to" a process is the sending process's I/O thread, the loopback,
and the wake-up of the receiver; the other parts are Python code in one process.

The notes come from wrapping fabric's ``send_frames`` and ``recv_frames`` (and pyzmq's
``send_multipart`` and ``recv_multipart`` for the raw peers) in every process, through a
``sitecustomize`` this script puts on the children's ``PYTHONPATH``. The wrapper adds one
Python call to each, in both systems, so the in-process parts read a little high. A read
whose notes do not fit the pattern (a heartbeat crossed it) is left out, and counted.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import os
import pickle
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR_VARIABLE = "FABRIC_HOPS_DIR"  # where each process leaves its notes, by pid
SENT, RECEIVED = 1, 2
PARTS = ("client sends", "to broker", "broker, request", "to worker", "worker",
         "to broker", "broker, reply", "to client", "client receives")
_SITECUSTOMIZE = f"""import os
if os.environ.get({DIR_VARIABLE!r}):
    import bench.hops
    bench.hops.install(os.environ[{DIR_VARIABLE!r}])
"""

_notes: list[tuple[int, int]] = []  # (monotonic ns, SENT or RECEIVED), this process's


def _noting(call: Callable[..., Any], event: int) -> Callable[..., Any]:
    clock, note = time.perf_counter_ns, _notes.append

    def noted(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        note((clock(), event))
        return result
    return noted


def install(directory: str | None) -> None:
    """Note every message this process sends and receives; leave the notes in
    ``directory`` at exit (if given)."""
    import fabric.transport.connection
    import fabric.core.sockets
    import fabric.broker.server
    import fabric.workers.control_io
    import fabric.workers.lane_io

    sockets = fabric.core.sockets
    sent, received = _noting(sockets.send_frames, SENT), _noting(sockets.recv_frames, RECEIVED)
    for module in (sockets, fabric.transport.connection, fabric.broker.server,
                   fabric.workers.control_io, fabric.workers.lane_io):
        # (the modules imported the functions by name: each binding is replaced)
        if hasattr(module, "send_frames"):
            module.send_frames = sent
        if hasattr(module, "recv_frames"):
            module.recv_frames = received
    zmq.Socket.send_multipart = _noting(zmq.Socket.send_multipart, SENT)
    zmq.Socket.recv_multipart = _noting(zmq.Socket.recv_multipart, RECEIVED)
    if directory is not None:
        atexit.register(_leave_notes, directory)


def _leave_notes(directory: str) -> None:
    if not os.path.isdir(directory):  # a helper process (multiprocessing's) outlived the run
        return
    with open(os.path.join(directory, str(os.getpid())), "wb") as f:
        pickle.dump(_notes, f)


def parts_of_reads(reads: list[tuple[int, int]], client: list[tuple[int, int]],
                   broker: list[tuple[int, int]], worker: list[tuple[int, int]]
                   ) -> list[list[float]]:
    """The nine parts, in µs, of each read whose notes fit: the client sends and receives
    once, the broker receives and sends twice, the worker once each."""
    found = []
    for notes in (client, broker, worker):
        notes.sort()
    times = [[n[0] for n in notes] for notes in (client, broker, worker)]
    for start, end in reads:
        seen = []
        for notes, at in zip((client, broker, worker), times):
            seen.append(notes[bisect.bisect_left(at, start):bisect.bisect_right(at, end)])
        if ([e for _, e in seen[0]] != [SENT, RECEIVED]
                or [e for _, e in seen[1]] != [RECEIVED, SENT, RECEIVED, SENT]
                or [e for _, e in seen[2]] != [RECEIVED, SENT]):
            continue
        (c1, c2), (b1, b2, b3, b4), (w1, w2) = ([t for t, _ in s] for s in seen)
        points = [start, c1, b1, b2, w1, w2, b3, b4, c2, end]
        found.append([(b - a) / 1000 for a, b in zip(points, points[1:])])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of reads each way")
    parser.add_argument("--reads", type=int, default=2000, help="reads per round and system")
    parser.add_argument("--port", type=int, default=27330, help="first of 2 loopback ports")
    args = parser.parse_args()
    import numpy as np
    sys.path.insert(0, ROOT)
    import fabric
    from bench.raw import RawPeers, raw_read
    from fabric.launch.local import with_bulk_malloc

    workdir = tempfile.TemporaryDirectory(prefix="fabric-hops-")
    hook, notes_dir = os.path.join(workdir.name, "hook"), os.path.join(workdir.name, "notes")
    os.makedirs(hook)
    os.makedirs(notes_dir)
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE)
    # Children (fabric's broker and worker, the raw peers) note theirs through the hook;
    # this process, the client of both, in memory.
    os.environ.update(with_bulk_malloc(os.environ))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [hook, ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ[DIR_VARIABLE] = notes_dir
    install(None)
    reads: dict[str, list[tuple[int, int]]] = {"raw": [], "fabric": []}
    clock = time.perf_counter_ns
    with RawPeers(True, args.port) as hop, fabric.LocalCluster(workers=1) as cluster, \
            cluster.connect(timeout=60) as session:
        pids = {"raw": (hop.procs[0].pid, hop.procs[1].pid),
                "fabric": (cluster.broker.pid, cluster.workers[0].pid)}
        tensor = session.asarray(np.arange(100.0))
        tensor.numpy()
        payload = np.arange(100.0).tobytes()
        for _ in range(args.rounds):  # in turn, so that a noisy neighbour slows both alike
            for _ in range(args.reads):
                start = clock()
                raw_read(hop.sock, payload)
                reads["raw"].append((start, clock()))
            for _ in range(args.reads):
                start = clock()
                tensor.numpy()
                reads["fabric"].append((start, clock()))
    client = list(_notes)

    def notes_of(pid: int) -> list[tuple[int, int]]:
        with open(os.path.join(notes_dir, str(pid)), "rb") as f:
            return pickle.load(f)

    medians = {}
    for system, (broker_pid, worker_pid) in pids.items():
        parts = parts_of_reads(reads[system], client, notes_of(broker_pid), notes_of(worker_pid))
        print(f"{system}: {len(parts)} of {len(reads[system])} reads fit the pattern")
        medians[system] = [statistics.median(p[i] for p in parts) for i in range(len(PARTS))]
        medians[system].append(statistics.median(sum(p) for p in parts))
    workdir.cleanup()
    print(f"median µs per read, {args.rounds} rounds of {args.reads} reads each way")
    print(f"{'part':18}{'fabric':>9}{'raw hop':>9}{'ratio':>8}")
    rows = list(zip((*PARTS, "whole read"), medians["fabric"], medians["raw"]))
    # (the parts alternate: work in a process, then the way to the next one)
    for label, picked in (("in processes", slice(0, len(PARTS), 2)),
                          ("between them", slice(1, len(PARTS), 2))):
        rows.append((label, sum(medians["fabric"][picked]), sum(medians["raw"][picked])))
    for name, fabric_us, raw_us in rows:
        print(f"{name:18}{fabric_us:9.1f}{raw_us:9.1f}{fabric_us / raw_us:7.2f}x")


if __name__ == "__main__":
    main()
