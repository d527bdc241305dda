"""A legitimate client's read latency while another client with many sessions floods PINGs.

    python bench/ping_flood.py --sessions 2048 --reads 200

A raw DEALER in another process (no GIL shared with the reader) opens ``--sessions``
sessions, then keeps ``--window`` PINGs in flight (each PONG answered by a new PING) while a
fabric client reads a small tensor ``--reads`` times. Printed: the read's median, 90th
percentile and mean, quiet and under the flood, and how many PINGs per second the broker answered.
Bounded: a fixed number of reads, every wait with a deadline.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.core import protocol  # noqa: E402
from fabric.core.protocol import Kind, Message  # noqa: E402
from fabric.core.security import present_token  # noqa: E402
from bench.run import w2_fabric  # noqa: E402

DEADLINE_MS = 10_000


def _recv(sock: zmq.Socket) -> protocol.Message:
    if not sock.poll(DEADLINE_MS):
        raise SystemExit("the broker did not answer within the deadline")
    return protocol.decode(sock.recv_multipart())


def _flooder(address: str, token: str, sessions: int, window: int, opened: Any, start: Any,
             done: Any, answered: Any) -> None:
    """The flooding client's process: its sessions, then PINGs from ``start`` to ``done``."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    present_token(sock, "client", token)
    sock.connect(address)
    try:
        for session in range(1, sessions + 1):
            sock.send_multipart(protocol.encode(Message(Kind.HELLO, session, session,
                                                        {"token": token, "device": 0})))
        for _ in range(sessions):
            assert _recv(sock).kind == Kind.WELCOME
        opened.set()
        if not start.wait(DEADLINE_MS / 1000):
            return
        for request in range(window):
            sock.send_multipart(protocol.encode(Message(Kind.PING, request=request)))
        while not done.is_set():
            _recv(sock)
            answered.value += 1
            sock.send_multipart(protocol.encode(Message(Kind.PING)))
        for _ in range(window):  # what is still in flight
            _recv(sock)
    finally:
        sock.close(linger=0)


def _summary(name: str, took: list[float]) -> str:
    ms = sorted(t * 1000 for t in took)
    return (f"{name}: median {statistics.median(ms):.2f} ms, "
            f"p90 {ms[int(len(ms) * 0.9)]:.2f} ms, mean {statistics.mean(ms):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2048)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--window", type=int, default=64, help="PINGs in flight")
    args = parser.parse_args()
    limits = ("--max-sessions-per-client", str(args.sessions),
              "--max-sessions-per-device", str(args.sessions + 16))
    spawn = multiprocessing.get_context("spawn")
    opened, start, done = spawn.Event(), spawn.Event(), spawn.Event()
    answered = spawn.Value("l", 0)
    with fabric.LocalCluster(workers=1, broker_args=limits) as cluster, \
            cluster.connect(device=0, timeout=10) as reader:
        flooder = spawn.Process(target=_flooder, args=(
            cluster.address, cluster.token, args.sessions, args.window, opened, start, done,
            answered))
        flooder.start()
        try:
            if not opened.wait(60):
                raise SystemExit("the flooding client did not open its sessions in time")
            quiet = w2_fabric(reader, args.reads)
            start.set()
            started = time.perf_counter()
            flooded = w2_fabric(reader, args.reads)
            seconds = time.perf_counter() - started
        finally:
            start.set()
            done.set()
            flooder.join(DEADLINE_MS / 1000)
            if flooder.is_alive():
                flooder.kill()
                flooder.join()
    print(f"{args.sessions} sessions on the flooding client, {args.window} PINGs in flight")
    print(_summary("read, quiet", quiet))
    print(_summary("read, under the PING flood", flooded))
    print(f"PINGs answered meanwhile: {answered.value} ({answered.value / seconds:.0f}/s)")


if __name__ == "__main__":
    main()
