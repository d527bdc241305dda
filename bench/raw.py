"""Raw pyzmq peers for the baselines: the limit fabric is measured against, in the same run.

A raw worker receives ``[client identity, *frames]`` and answers ``[client identity, reply]``
either on a bound ROUTER (direct) or on a DEALER behind the minimal Python broker hop below
(the same loop shape as any Python broker: a poller, two ROUTERs, forward frames as they are).
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import numpy as np
import zmq

BULK_BYTES = 256 << 20


def raw_worker(address: str, behind_broker: bool) -> None:
    """Answer b"ping" with the payload, b"bulk-get" with a 256 MiB frame, others with b"ok"."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER if behind_broker else zmq.ROUTER)
    if behind_broker:
        sock.connect(address)
        sock.send(b"ready")
    else:
        sock.bind(address)
    bulk = memoryview(bytearray(BULK_BYTES))
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            client, command = frames[0], frames[1].bytes
            if command == b"stop":
                return
            if command == b"sink":
                continue  # W1: fire-and-forget, no answer
            if command == b"bulk-get":
                sock.send_multipart([client, bulk], copy=False)
            elif command == b"ping":
                sock.send_multipart([client, frames[2]], copy=False)
            else:
                sock.send_multipart([client, b"ok"])
    finally:
        sock.close(linger=0)
        context.term()


def raw_broker(frontend: str, worker_address: str) -> None:
    """The minimal Python broker hop: one worker, frames forwarded without copying."""
    context = zmq.Context()
    front, workers = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    front.bind(frontend)
    workers.bind(worker_address)
    worker = workers.recv_multipart()[0]  # its "ready"
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(workers, zmq.POLLIN)
    try:
        while True:
            for sock, _ in poller.poll():
                frames = sock.recv_multipart(copy=False)
                if sock is front:
                    workers.send_multipart([worker, *frames], copy=False)
                    if frames[1].bytes == b"stop":
                        return
                else:
                    front.send_multipart(frames[1:], copy=False)
    finally:
        front.close(linger=100)
        workers.close(linger=100)
        context.term()


def wait_until_answered(sock: zmq.Socket, timeout: float, every: float) -> None:
    """Say hello every ``every`` seconds until the whole path answers, then read what came."""
    deadline = time.monotonic() + timeout
    while True:
        sock.send_multipart([b"hello"])
        if sock.poll(int(every * 1000)):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the raw peers did not start")
    while sock.poll(100):
        sock.recv_multipart()


def raw_read(sock: zmq.Socket, payload: bytes) -> np.ndarray:
    """One W2 read, raw: a request, and its reply's bytes made an array (as fabric does)."""
    sock.send_multipart([b"ping", payload])
    frames = sock.recv_multipart(copy=False)
    return np.frombuffer(frames[0].buffer, dtype=np.float64).copy()


class RawPeers:
    """A raw worker, direct or behind the raw broker, in child processes; a context manager."""

    def __init__(self, behind_broker: bool, port: int) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.address = f"tcp://127.0.0.1:{port}"
        self.procs: list[Any] = []
        if behind_broker:
            worker_address = f"tcp://127.0.0.1:{port + 1}"
            self.procs.append(spawn.Process(target=raw_broker,
                                            args=(self.address, worker_address)))
            self.procs.append(spawn.Process(target=raw_worker, args=(worker_address, True)))
        else:
            self.procs.append(spawn.Process(target=raw_worker, args=(self.address, False)))

    def __enter__(self) -> "RawPeers":
        for proc in self.procs:
            proc.start()
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.address)
        wait_until_answered(self.sock, timeout=10, every=0.2)
        return self

    def __exit__(self, *_: Any) -> None:
        self.sock.send(b"stop")
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.sock.close()
        self.context.term()
