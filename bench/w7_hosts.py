"""Large tensors between two simulated hosts (network namespaces on a bridge running sshd,
``tests/simhosts.py``; root and openssh-server needed): ``t.to()`` from a worker on one host
to a worker on the other, and W3 (an upload from this side to a host, and a read back), over
direct links and through the broker (``--bulk-host none``), against raw TCP between the same
two places (a pyzmq PAIR, each message answered, as ``t.to()`` and an upload are), in the
same run. A read of 8 MiB or more takes a direct link as an upload does.

    python bench/w7_hosts.py [--repeats R] [--mib 64,256]

Each figure is the median, over R moves, of one move's wall time, as MB/s (10^6 bytes).
Raw peers on the hosts run with fabric's bulk malloc settings, as its workers do; raw peers on
this side with this process's environment, as the client (this process) does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

import simhosts  # noqa: E402

import fabric  # noqa: E402
from bench.timing import median_seconds  # noqa: E402
from fabric.cluster import with_bulk_malloc  # noqa: E402
from fabric.launch_ssh import SSHCluster, parse_hosts  # noqa: E402

RAW_PORT = 47100



def raw_receive(address: str) -> None:
    """Answer each message on a PAIR bound at ``address`` with b"ok", until b"stop"."""
    with zmq.Context() as context, context.socket(zmq.PAIR) as sock:
        sock.bind(address)
        while len(message := sock.recv(copy=False)) != 4 or message.bytes != b"stop":
            sock.send(b"ok")


def raw_send(address: str, nbytes: int, repeats: int) -> float:
    """Median seconds to send ``nbytes`` to ``raw_receive`` at ``address`` and hear back."""
    payload = np.ones(nbytes, np.uint8)
    with zmq.Context() as context, context.socket(zmq.PAIR) as sock:
        sock.connect(address)

        def move() -> None:
            sock.send(payload, copy=False)
            sock.recv()

        seconds = median_seconds(move, repeats)
        sock.send(b"stop")
    return seconds


def raw_tcp(namespaces: tuple[str | None, str], address: str, nbytes: int,
            repeats: int) -> float:
    """Raw TCP from namespace ``namespaces[0]`` to a receiver in ``namespaces[1]`` (None:
    this side) at ``address``: median seconds per message."""
    where = f"tcp://{address}:{RAW_PORT}"

    def in_namespace(namespace: str | None, *args: str) -> dict:
        command = [sys.executable, __file__, *args]
        if namespace is None:
            return {"args": command, "env": os.environ}
        return {"args": ["ip", "netns", "exec", namespace, *command],
                "env": with_bulk_malloc(os.environ)}

    receiver = subprocess.Popen(**in_namespace(namespaces[1], "--raw-receive", where))
    try:
        sent = subprocess.run(**in_namespace(namespaces[0], "--raw-send", where, str(nbytes),
                                             str(repeats)), check=True,
                              capture_output=True, text=True, timeout=600)
        return float(sent.stdout)
    finally:
        receiver.wait(10)


def fabric_moves(hosts: simhosts.SimulatedHosts, bulk_host: str, nbytes: int,
                 repeats: int) -> dict[str, float]:
    """Median seconds of ``t.to()`` from host 0's worker to host 1's, and of an upload to
    and a read from host 1's, for a cluster whose workers have ``--bulk-host bulk_host``."""
    with SSHCluster(parse_hosts(",".join(hosts.addresses)), remote_python=sys.executable,
                    ssh_config=str(hosts.ssh_config), backend_address="tcp://0.0.0.0:*",
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
            return {"to": median_seconds(lambda: tensor.to(there), repeats),
                    "up": median_seconds(lambda: (there.asarray(values), there.sync()), repeats),
                    "down": median_seconds(on_there.numpy, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mib", default="64,256", help="sizes, in MiB, comma-separated")
    parser.add_argument("--raw-receive", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--raw-send", nargs=3, metavar="ARG", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.raw_receive:
        return raw_receive(options.raw_receive)
    if options.raw_send:
        address, nbytes, repeats = options.raw_send
        return print(raw_send(address, int(nbytes), int(repeats)))
    reason = simhosts.missing()
    if reason:
        sys.exit(f"bench/w7_hosts.py: {reason}")
    with tempfile.TemporaryDirectory() as work, \
            simhosts.simulated_hosts(Path(work), 2) as hosts:
        for mib in (int(m) for m in options.mib.split(",")):
            nbytes = mib << 20
            between = raw_tcp(tuple(hosts.namespaces), hosts.addresses[1], nbytes,
                              options.repeats)
            to_host = raw_tcp((None, hosts.namespaces[1]), hosts.addresses[1], nbytes,
                              options.repeats)
            from_host = raw_tcp((hosts.namespaces[1], None), hosts.bridge_address, nbytes,
                                options.repeats)
            direct = fabric_moves(hosts, "auto", nbytes, options.repeats)
            brokered = fabric_moves(hosts, "none", nbytes, options.repeats)

            def rate(seconds: float) -> str:
                return f"{nbytes / seconds / 1e6:7.0f} MB/s"

            print(f"{mib} MiB, median of {options.repeats}:")
            print(f"  raw TCP host 0 -> host 1      {rate(between)}")
            print(f"  raw TCP this side -> host 1   {rate(to_host)}")
            print(f"  raw TCP host 1 -> this side   {rate(from_host)}")
            for name, figures in (("direct links", direct), ("through the broker", brokered)):
                for way, raw in (("to", between), ("up", to_host), ("down", from_host)):
                    what = "t.to()" if way == "to" else f"W3 {way}"
                    print(f"  {what:8} {name:19} {rate(figures[way])}  "
                          f"{raw / figures[way]:.2f}x raw")


if __name__ == "__main__":
    main()
