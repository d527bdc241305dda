"""A broker pair whose link between the brokers is cut while both still reach the workers and
clients (``broker.pair``'s split-brain guard), in a network namespace: the backup runs inside
it, joined to this namespace by two veth links, one carrying only the pair's state heartbeats
(the one cut) and one carrying the clients' and workers' traffic (kept up)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Iterator

import pytest
from polling import wait_for

import fabric
from conftest import HEARTBEAT
from fabric.client.admin import pair_roles
from fabric.launch.local import _end, _read_line
from test_failover import BOUND, PAIR_HEARTBEAT, PAIR_LIVENESS, computes

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="a cut link needs root and iproute2's ip (network namespaces)")]

TOKENS = {"FABRIC_TOKEN": "partition-client", "FABRIC_WORKER_TOKEN": "partition-worker",
          "FABRIC_ADMIN_TOKEN": "partition-admin"}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def two_links() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """A namespace joined to this one by two veth links on /30s of their own (198.18.0.0/15,
    RFC 2544, chosen from this process's id); yields the namespace and, per link, (the host
    end's interface, its address, the namespace end's address). Deleted afterwards."""
    pid = os.getpid()
    namespace = f"fabric-pair-{pid}"
    try:
        _ip("netns", "add", namespace)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot make a network namespace here: {exc}")
    links = []
    try:
        for n in range(2):
            base = ipaddress.IPv4Address("198.18.0.0") + (((pid << 3) + 4 * n) % (1 << 17))
            host, inside = f"fq{n}h{pid}", f"fq{n}n{pid}"
            _ip("link", "add", host, "type", "veth", "peer", "name", inside, "netns", namespace)
            _ip("addr", "add", f"{base + 1}/30", "dev", host)
            _ip("link", "set", host, "up")
            _ip("-n", namespace, "addr", "add", f"{base + 2}/30", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            links.append((host, str(base + 1), str(base + 2)))
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield namespace, links
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        for host, _, _ in links:
            subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=10)


def start(command: list[str], prefix: list[str] = ()) -> tuple[subprocess.Popen, dict]:
    """``python -m fabric COMMAND`` (in a namespace with ``prefix``) and its ready line."""
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "fabric", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, **TOKENS})
    line = _read_line(proc, time.monotonic() + 30)
    if not line:
        _end(proc)
        pytest.fail(f"fabric {' '.join(command)} did not start")
    return proc, json.loads(line)


def test_a_cut_link_between_the_brokers_alone_makes_no_second_active(tmp_path):
    port = 20000 + os.getpid() % 20000  # (the pair's state ports: each names the other's)
    with two_links() as (namespace, [(pair_link, host_pair, ns_pair), (_, _, ns_data)]):
        timing = ["--heartbeat", str(HEARTBEAT), "--pair-heartbeat", str(PAIR_HEARTBEAT),
                  "--pair-liveness", str(PAIR_LIVENESS)]
        processes = []
        try:
            primary, ready_primary = start(
                ["broker", "--frontend", "tcp://127.0.0.1:*", "--worker-address",
                 "tcp://127.0.0.1:*", "--pair-address", f"tcp://{host_pair}:{port}",
                 "--peer", f"tcp://{ns_pair}:{port + 1}", "--primary", *timing])
            processes.append(primary)
            backup, ready_backup = start(
                ["broker", "--frontend", f"tcp://{ns_data}:*", "--worker-address",
                 f"tcp://{ns_data}:*", "--pair-address", f"tcp://{ns_pair}:{port + 1}",
                 "--peer", f"tcp://{host_pair}:{port}", "--backup", *timing],
                ["ip", "netns", "exec", namespace])
            processes.append(backup)
            brokers = f"{ready_primary['frontend']},{ready_backup['frontend']}"
            worker = subprocess.Popen(
                [sys.executable, "-m", "fabric", "worker", "--broker",
                 f"{ready_primary['workers']},{ready_backup['workers']}", "--name", "w",
                 "--heartbeat", str(HEARTBEAT), "--threads", "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, **TOKENS})
            processes.append(worker)

            def states() -> list:
                return [row.get("pair", {}).get("state") for row in pair_roles(
                    brokers, token=TOKENS["FABRIC_ADMIN_TOKEN"])]

            wait_for(lambda: states() == ["active", "passive"], 30, "the pair to form")
            wait_for(lambda: fabric.devices(brokers, token=TOKENS["FABRIC_TOKEN"], timeout=5), 30,
                     "the worker to register")
            with fabric.connect(brokers, token=TOKENS["FABRIC_TOKEN"], timeout=30) as session:
                computes(session)
                _ip("link", "set", pair_link, "down")  # only the pair's heartbeats are cut
                time.sleep(3 * BOUND)  # each broker's peer is long silent now
                # Nobody knocks at the backup: the worker and the clients stay with the
                # primary, which serves on; the backup stays passive.
                computes(session)
                with fabric.connect(brokers, token=TOKENS["FABRIC_TOKEN"],
                                    timeout=10) as fresh:
                    computes(fresh)
                rows = pair_roles(brokers, token=TOKENS["FABRIC_ADMIN_TOKEN"])
                assert [row["pair"]["state"] for row in rows] == ["active", "passive"]
                assert all(row["pair"]["peer_silent_for"] > BOUND for row in rows)  # (cut)
                _ip("link", "set", pair_link, "up")
                wait_for(lambda: all(row["pair"]["peer_silent_for"] < BOUND for row in pair_roles(
                    brokers, token=TOKENS["FABRIC_ADMIN_TOKEN"])), 30, "the link mended")
                assert states() == ["active", "passive"]
                computes(session)
        finally:
            for proc in reversed(processes):
                _end(proc)
