"""W3 (256 MiB float64 up and back) through shared memory, beside the socket path, a warm
memcpy of the same bytes and a raw DEALER-to-ROUTER link, measured in the same run.

    python bench/w3_shm.py            # medians of 5 interleaved runs, GB/s and ratios

It also moves the 256 MiB tensor between the cluster's two workers (``t.to()``), each way
through shared memory and through the broker, and an 8 MiB one through shared memory (where
a round trip's cost shows: a move into a slot the receiver lent ahead makes three, not four).

"shm" is ``fabric.connect``'s default on one host (uploads of 1 MiB and more written into a
slot of the device's own pool lent ahead, which the tensor keeps: the first run's upload,
with none lent yet, goes through the connection's pool; a read of a tensor in the device's
slot maps that slot copy on write, pinned: no copy, its GB/s the tensor's bytes over one round
trip and the mapping; the first run's read is written by the worker into a slot of the
connection's pool); "shm copy-out" is the same on workers started with
``--shared-memory-limit 0``, whose uploads and moves go through the client's slots and are
copied out on the worker (the path before one-copy uploads); "shm view" reads with
``t.numpy(copy=False)`` (a read-only view of the device's own slot, pinned: no copy; its
GB/s is the tensor's bytes over one round trip); "shm 1 thread" is "shm" on a cluster and
connection that copy on one thread (``--copy-threads 1``: the path before parallel
copies); "shm zero-copy" uploads with ``session.upload_buffer`` and ``asarray`` of it (the
slot lent and the tensor made of it: no copy; the caller's writing of the values is not
counted); "socket" is the same cluster with ``shared_memory=False``; "memcpy" is
``np.copyto`` into a warm buffer of the same size, the ceiling for any path that copies once
on one thread; "parallel memcpy" is the same copy in pieces on the copying threads the
shared-memory path uses (``fabric.core.parallel_copy``, as many as ``FABRIC_COPY_THREADS`` says or
the cores allow), its ceiling. Where Ray is installed, its put and get of the same array are
timed in the same runs (``bench/ray_peer.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.ray_peer import RayPeer, installed as ray_installed  # noqa: E402
from bench.raw import BULK_BYTES, RawPeers  # noqa: E402
from bench.run import w3_rates, w3_raw  # noqa: E402
from fabric.core.parallel_copy import ParallelCopy  # noqa: E402
from fabric.launch.local import with_bulk_malloc  # noqa: E402

SMALL_MOVE_BYTES = 8 << 20  # a move whose round trips weigh (its copy takes ~1 ms)


def w3_view(session: fabric.Session, array: np.ndarray) -> float:
    """GB/s of a read that returns a read-only view (``copy=False``)."""
    tensor = session.asarray(array)
    session.sync()
    start = time.perf_counter()
    back = tensor.numpy(copy=False)
    down = time.perf_counter() - start
    assert back.nbytes == array.nbytes and back[-1] == array[-1]
    del tensor, back
    session.sync()
    return array.nbytes / down / 1e9


def w3_zero_copy(session: fabric.Session, array: np.ndarray) -> float:
    """GB/s of an upload written in place (``upload_buffer``, then ``asarray`` of it): the
    time to have the buffer and to make it a tensor, not the caller's writing of it."""
    start = time.perf_counter()
    buffer = session.upload_buffer(array.shape, array.dtype)
    lent = time.perf_counter() - start
    assert buffer.base is not None, "no slot was lent for the buffer"
    np.copyto(buffer, array)  # (the caller's own writing of its values)
    start = time.perf_counter()
    tensor = session.asarray(buffer)
    session.sync()
    up = lent + time.perf_counter() - start
    assert tensor[-1].numpy() == array[-1]
    del tensor, buffer
    session.sync()
    return array.nbytes / up / 1e9


def move(source: fabric.Session, destination: fabric.Session, array: np.ndarray) -> float:
    """GB/s of ``t.to(destination)`` of a tensor of ``source`` holding ``array``."""
    tensor = source.asarray(array)
    source.sync()
    start = time.perf_counter()
    moved = tensor.to(destination)
    elapsed = time.perf_counter() - start
    assert moved[-1].numpy() == array[-1]
    del tensor, moved
    source.sync()
    destination.sync()
    return array.nbytes / elapsed / 1e9


def memcpy(array: np.ndarray, warm: np.ndarray, copies: ParallelCopy) -> float:
    """GB/s of one copy of ``array`` into ``warm``, a buffer whose pages are already mapped
    (with ``copies``: in its pieces, on its threads)."""
    start = time.perf_counter()
    copies.copy(warm, array)
    return array.nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--port", type=int, default=27330,
                        help="loopback port of the raw direct peer")
    args = parser.parse_args()
    os.environ.update(with_bulk_malloc(os.environ))  # the raw peer's allocator, as fabric's
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    warm = np.ones_like(array)
    one_copy, parallel_copy = ParallelCopy(threads=1), ParallelCopy()
    figures: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    with RawPeers(False, args.port) as direct, fabric.LocalCluster(workers=2) as cluster, \
            fabric.LocalCluster(workers=2,
                                worker_args=("--shared-memory-limit", "0")) as copying, \
            fabric.LocalCluster(workers=2, worker_args=("--copy-threads", "1")) as single, \
            fabric.connect(single.address, token=single.token, timeout=60,
                           shared_memory=fabric.SharedMemory(copy_threads=1)) as one, \
            one.open(1, timeout=60) as one_other, \
            fabric.connect(cluster.address, token=cluster.token, timeout=60) as shm, \
            fabric.connect(copying.address, token=copying.token, timeout=60) as copied, \
            fabric.connect(cluster.address, token=cluster.token, timeout=60,
                           shared_memory=False) as socket, \
            shm.open(1, timeout=60) as shm_other, copied.open(1, timeout=60) as copied_other, \
            socket.open(1, timeout=60) as socket_other, \
            (RayPeer(array) if ray_installed() else contextlib.nullcontext()) as ray:
        for _ in range(args.runs):  # interleaved: a noisy neighbour slows all alike
            # (each shared-memory session runs the same steps: their pools' slots alike)
            for name, session, other in (("shm", shm, shm_other),
                                         ("shm 1 thread", one, one_other)):
                up, down = w3_rates(session, array)
                note(f"up {name}", up)
                note(f"down {name}", down)
                note(f"down {name} view", w3_view(session, array))
                note(f"up {name} zero-copy", w3_zero_copy(session, array))
                note(f"to {name}", move(session, other, array))
                note(f"to {name} 8 MiB", move(session, other, array[:SMALL_MOVE_BYTES // 8]))
            for name, up_down in (("shm copy-out", w3_rates(copied, array)),
                                  ("socket", w3_rates(socket, array)),
                                  ("raw direct", w3_raw(direct, array))):
                note(f"up {name}", up_down[0])
                note(f"down {name}", up_down[1])
            note("to shm copy-out", move(copied, copied_other, array))
            note("to socket", move(socket, socket_other, array))
            note("memcpy", memcpy(array, warm, one_copy))
            note("parallel memcpy", memcpy(array, warm, parallel_copy))
            for name, value in ray.once().items() if ray is not None else ():
                note(f"ray {name}", value)
        parallel_copy.close()
        assert shm.shares_memory is True, "the shared-memory path was not taken"
        assert not shm.connection.segments.slotless, "a device lent no slot of its own"

    median = {name: statistics.median(values) for name, values in figures.items()}
    copy, parallel = median["memcpy"], median["parallel memcpy"]
    print(f"W3, 256 MiB float64; medians of {args.runs} interleaved runs, GB/s "
          f"(warm memcpy {copy:.2f}; parallel memcpy {parallel:.2f}, "
          f"{parallel_copy.threads} threads)")
    print(f"{'path':<16}{'up':>8}{'down':>8}{'up/memcpy':>11}{'down/memcpy':>13}"
          f"{'up/par':>8}{'down/par':>10}{'up/raw':>8}{'down/raw':>10}")
    raw_up, raw_down = median["up raw direct"], median["down raw direct"]
    # (a view is a way down only, a zero-copy upload a way up: each shows shm's other; those
    # of "shm 1 thread" copy nothing either, and are not shown)
    for name, up_key, down_key in (
            ("shm", "up shm", "down shm"),
            ("shm 1 thread", "up shm 1 thread", "down shm 1 thread"),
            ("shm copy-out", "up shm copy-out", "down shm copy-out"),
            ("shm view", "up shm", "down shm view"),
            ("shm zero-copy", "up shm zero-copy", "down shm"),
            ("socket", "up socket", "down socket"),
            ("raw direct", "up raw direct", "down raw direct")):
        up, down = median[up_key], median[down_key]
        print(f"{name:<16}{up:>8.2f}{down:>8.2f}{up / copy:>11.2f}{down / copy:>13.2f}"
              f"{up / parallel:>8.2f}{down / parallel:>10.2f}"
              f"{up / raw_up:>8.2f}{down / raw_down:>10.2f}")
    for name in ("shm", "shm 1 thread", "shm copy-out", "socket"):
        to = median[f"to {name}"]
        print(f"t.to() worker 0 -> 1, {name}: {to:.2f} GB/s, {to / copy:.2f}x memcpy, "
              f"{to / parallel:.2f}x parallel memcpy")
    for name in ("shm", "shm 1 thread"):
        to = median[f"to {name} 8 MiB"]
        print(f"t.to() worker 0 -> 1, {name}, 8 MiB: {to:.2f} GB/s, "
              f"{SMALL_MOVE_BYTES / to / 1e6:.2f} ms")
    if "ray up" in median:
        print("Ray, same runs (" + ", ".join(
            f"{name} {median[f'ray {name}']:.2f}" for name in ("up", "down", "down view",
                                                                "actor push"))
              + f" GB/s): shm up {median['up shm'] / median['ray up']:.2f}x Ray's, "
              f"down {median['down shm'] / median['ray down']:.2f}x, view "
              f"{median['down shm view'] / median['ray down view']:.2f}x")
    else:
        print("Ray: not installed here (pip install -e '.[bench]' to measure it in the same "
              "runs)")


if __name__ == "__main__":
    main()
