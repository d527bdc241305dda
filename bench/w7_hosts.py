"""Large tensors between two simulated hosts (network namespaces on a bridge running sshd,
``tests/simhosts.py``; root and openssh-server needed): ``t.to()`` from a worker on one host
to a worker on the other, and W3 (an upload from this side to a host, and a read back), over
direct links and through the broker (``--bulk-host none``), against raw TCP between the same
two places (a pyzmq PAIR, each message answered, as ``t.to()`` and an upload are), in the
same run. A read of 8 MiB or more takes a direct link as an upload does.

    python bench/w7_hosts.py [--repeats R] [--mib 64,256]

Each figure is the median, over R moves, of one move's wall time, as MB/s (10^6 bytes); the
moves of every path take turns (interleaved: a noisy neighbour slows all alike), each raw
pair's processes and each cluster kept for the whole run.
Raw peers on the hosts run with fabric's bulk malloc settings, as its workers do; raw peers on
this side with this process's environment, as the client (this process) does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

import simhosts  # noqa: E402

import fabric  # noqa: E402
from fabric.launch.local import with_bulk_malloc  # noqa: E402
from bench.timing import seconds  # noqa: E402
from fabric.launch.ssh import SSHCluster, parse_hosts  # noqa: E402

RAW_PORT = 47100
MOVE_SECONDS = 120  # the longest a raw move may take before the bench gives up



def raw_receive(address: str) -> None:
    """Answer each message on a PAIR bound at ``address`` with b"ok", until b"stop"."""
    with zmq.Context() as context, context.socket(zmq.PAIR) as sock:
        sock.bind(address)
        while len(message := sock.recv(copy=False)) != 4 or message.bytes != b"stop":
            sock.send(b"ok")


def raw_send(address: str, nbytes: int) -> None:
    """For each line on stdin, send ``nbytes`` to ``raw_receive`` at ``address``, hear
    back, and print the seconds it took; at the end of stdin, stop the receiver."""
    payload = np.ones(nbytes, np.uint8)
    with zmq.Context() as context, context.socket(zmq.PAIR) as sock:
        sock.connect(address)
        for _ in sys.stdin:
            start = time.perf_counter()
            sock.send(payload, copy=False)
            sock.recv()
            print(time.perf_counter() - start, flush=True)
        sock.send(b"stop")


@contextlib.contextmanager
def raw_tcp(namespaces: tuple[str | None, str], address: str, port: int,
            nbytes: int) -> Iterator[Callable[[], float]]:
    """Raw TCP from namespace ``namespaces[0]`` to a receiver in ``namespaces[1]`` (None:
    this side) at ``address``: a call that moves ``nbytes`` once and gives its seconds."""
    where = f"tcp://{address}:{port}"

    def in_namespace(namespace: str | None, *args: str) -> dict:
        command = [sys.executable, __file__, *args]
        if namespace is None:
            return {"args": command, "env": os.environ}
        return {"args": ["ip", "netns", "exec", namespace, *command],
                "env": with_bulk_malloc(os.environ)}

    receiver = subprocess.Popen(**in_namespace(namespaces[1], "--raw-receive", where))
    sender = subprocess.Popen(**in_namespace(namespaces[0], "--raw-send", where, str(nbytes)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def move() -> float:
        sender.stdin.write("go\n")
        sender.stdin.flush()
        if not select.select([sender.stdout], [], [], MOVE_SECONDS)[0]:
            raise TimeoutError(f"raw TCP to {where} moved nothing in {MOVE_SECONDS} s")
        return float(sender.stdout.readline())

    try:
        yield move
    finally:
        sender.stdin.close()  # (the end of its stdin stops the sender, which stops the other)
        for process in (sender, receiver):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@contextlib.contextmanager
def fabric_moves(hosts: simhosts.SimulatedHosts, bulk_host: str,
                 nbytes: int) -> Iterator[dict[str, Callable[[], float]]]:
    """Calls that time one ``t.to()`` from host 0's worker to host 1's, one upload to host
    1's and one read from it, on a cluster whose workers have ``--bulk-host bulk_host``."""
    with SSHCluster(parse_hosts(",".join(hosts.addresses)), remote_python=sys.executable,
                    ssh_config=str(hosts.ssh_config), worker_address="tcp://0.0.0.0:*",
                    advertise=hosts.bridge_address,
                    worker_args=("--bulk-host", bulk_host)) as cluster:
        devices = sorted(cluster.devices(), key=lambda d: d.worker)
        here, there = (fabric.connect(cluster.address, token=cluster.token, device=d.index,
                                      shared_memory=False) for d in devices)
        with here, there:
            values = np.ones(nbytes // 8)
            tensor = here.asarray(values)
            here.sync()
            on_there = there.asarray(values)
            there.sync()
            yield {"to": lambda: seconds(lambda: tensor.to(there)),
                   "up": lambda: seconds(lambda: (there.asarray(values), there.sync())),
                   "down": lambda: seconds(on_there.numpy)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mib", default="64,256", help="sizes, in MiB, comma-separated")
    parser.add_argument("--raw-receive", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--raw-send", nargs=2, metavar="ARG", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.raw_receive:
        return raw_receive(options.raw_receive)
    if options.raw_send:
        return raw_send(options.raw_send[0], int(options.raw_send[1]))
    reason = simhosts.missing()
    if reason:
        sys.exit(f"bench/w7_hosts.py: {reason}")
    with tempfile.TemporaryDirectory() as work, \
            simhosts.simulated_hosts(Path(work), 2) as hosts:
        for mib in (int(m) for m in options.mib.split(",")):
            nbytes = mib << 20
            with raw_tcp(tuple(hosts.namespaces), hosts.addresses[1], RAW_PORT,
                         nbytes) as between, \
                    raw_tcp((None, hosts.namespaces[1]), hosts.addresses[1], RAW_PORT + 1,
                            nbytes) as to_host, \
                    raw_tcp((hosts.namespaces[1], None), hosts.bridge_address, RAW_PORT + 2,
                            nbytes) as from_host, \
                    fabric_moves(hosts, "auto", nbytes) as direct, \
                    fabric_moves(hosts, "none", nbytes) as brokered:
                runs = {"raw to": between, "raw up": to_host, "raw down": from_host,
                        **{f"direct {way}": run for way, run in direct.items()},
                        **{f"brokered {way}": run for way, run in brokered.items()}}
                for run in runs.values():
                    run()  # (each path warm)
                times: dict[str, list[float]] = {name: [] for name in runs}
                for _ in range(options.repeats):  # interleaved: noise slows all alike
                    for name, run in runs.items():
                        times[name].append(run())
            median = {name: statistics.median(values) for name, values in times.items()}

            def rate(name: str) -> str:
                return f"{nbytes / median[name] / 1e6:7.0f} MB/s"

            print(f"{mib} MiB, median of {options.repeats} interleaved runs:")
            print(f"  raw TCP host 0 -> host 1      {rate('raw to')}")
            print(f"  raw TCP this side -> host 1   {rate('raw up')}")
            print(f"  raw TCP host 1 -> this side   {rate('raw down')}")
            for name, label in (("direct", "direct links"), ("brokered", "through the broker")):
                for way in ("to", "up", "down"):
                    what = "t.to()" if way == "to" else f"W3 {way}"
                    print(f"  {what:8} {label:19} {rate(f'{name} {way}')}  "
                          f"{median[f'raw {way}'] / median[f'{name} {way}']:.2f}x raw")


if __name__ == "__main__":
    main()
