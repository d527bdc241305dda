"""Direct links between workers on different hosts (issue 25, "Between hosts"), end to end:
a broker on this side, a worker on each of two simulated hosts (network namespaces on a
bridge, started over ssh: ``tests/simhosts.py``), a client here. ``t.to()`` of a large tensor
goes worker to worker over a link the broker granted; a peer without the one-time ticket is
refused in the handshake; an unreachable endpoint falls back to the broker; CURVE applies; a
link cut mid-send is retried through the broker; a link between IPv6 addresses works (on a
second network that the hosts and this side join, ``simhosts.SecondNetwork``, which can be
slowed and cut while the broker stays reachable).
The rules themselves are tested sans I/O in ``unit/test_direct_link_rules.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import zmq

import fabric
from fabric.core.errors import QuotaExceeded, SessionLost
from fabric.core.security import LINK_STALL_SECONDS, LINK_USER, generate_keys
from fabric.launch.ssh import SSHCluster, parse_hosts
from fabric.transport.direct_link import DIRECT_BYTES
from fabric.workers.direct_links import CONNECT_SECONDS

import simhosts
from conftest import HEARTBEAT
from polling import wait_for

pytestmark = pytest.mark.timeout(60)

LARGE = 3 << 20  # bytes: past the link threshold (1 MiB)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = simhosts.missing()
    if reason:
        pytest.skip(reason)
    with simhosts.simulated_hosts(tmp_path_factory.mktemp("hosts"), 2,
                                       second_network=True) as made:
        yield made


def _cluster(hosts: simhosts.SimulatedHosts, log_dir: Path, *worker_args: str,
             bulk_hosts: list[str] | None = None, **options) -> SSHCluster:
    """A worker on each simulated host; the broker here, on the bridge. With ``bulk_hosts``
    each worker's direct links are at its host's address there (on the second network, say)."""
    pythons = [sys.executable] * len(hosts.addresses) if bulk_hosts is None else [
        _python_with_bulk_host(log_dir, host) for host in bulk_hosts]
    return SSHCluster(parse_hosts(",".join(f"{address} python={python}" for address, python
                                           in zip(hosts.addresses, pythons))),
                      remote_python=sys.executable,
                      ssh_config=str(hosts.ssh_config), worker_address="tcp://0.0.0.0:*",
                      advertise=hosts.bridge_address, heartbeat=HEARTBEAT, log_dir=log_dir,
                      worker_args=("--log-level", "info", *worker_args), **options)


def _python_with_bulk_host(work: Path, bulk_host: str) -> str:
    """A python for one simulated host whose ``fabric worker`` takes ``--bulk-host
    bulk_host`` (a worker option given to one host only; the later option wins)."""
    script = work / f"python-bulk-{bulk_host.replace(':', '_')}"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" --bulk-host {bulk_host}\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="module")
def direct(hosts, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    with _cluster(hosts, log_dir) as running:
        yield running


def _sessions(cluster: SSHCluster) -> tuple[fabric.Session, fabric.Session]:
    """A session on each host's device. Shared memory off: this side shares the hosts'
    /dev/shm (one machine), which real other hosts would not."""
    devices = sorted(cluster.devices(), key=lambda d: d.worker)
    return tuple(fabric.connect(cluster.address, token=cluster.token, device=d.index,
                                curve=cluster.curve, shared_memory=False) for d in devices)


def _counters(cluster: SSHCluster) -> dict[str, int]:
    with cluster.admin() as admin:
        status = admin.status()
    return {"traffic": status["traffic"]["bytes"], **status["counters"]}


def _link_refusals(cluster: SSHCluster) -> int:
    """The peers the cluster's workers' direct-link endpoints refused, as last reported."""
    with cluster.admin() as admin:
        return sum(row["link_refusals"] for row in admin.workers())


def _link_figures(cluster: SSHCluster) -> dict[str, int]:
    """What the cluster's workers' direct links carried, summed over the workers, as last
    reported (``link_sent``, ``link_sent_bytes``, ...)."""
    with cluster.admin() as admin:
        rows = admin.workers()
    return {key: sum(row[key] or 0 for row in rows) for key in rows[0] if key.startswith("link_")}


def _bulk_address(log_dir: Path, host: str) -> str:
    """The direct-link endpoint the worker on ``host`` logged."""
    [log] = [p for p in log_dir.iterdir() if host in p.name]
    return re.search(r"direct links at (tcp://\S+)", log.read_text()).group(1)


EVERY_DTYPE = [np.dtype(c) for c in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]
               if np.dtype(c).kind != "f" or np.dtype(c).itemsize <= 8]  # (no longdouble)
VALUES = [
    *(np.random.default_rng(25).integers(0, 100, LARGE // dtype.itemsize).astype(dtype)
      for dtype in EVERY_DTYPE),
    np.arange(LARGE // 4, dtype=np.int32).reshape(-1, 1024),
    np.asfortranarray(np.random.default_rng(2).random((1024, 512))).astype(np.float32),
    np.random.default_rng(3).integers(0, 2, LARGE, dtype=np.uint8).astype(bool),
    (np.arange(LARGE // 8, dtype=np.complex64) * 1j)[::2],  # a non-contiguous view
    np.arange(LARGE // 2, dtype=np.float16).reshape(2, -1)[:, ::-1],
]


def test_large_tensors_move_between_hosts_over_a_direct_link_byte_for_byte(direct):
    here, there = _sessions(direct)
    with here, there:
        before, carried = _counters(direct), _link_figures(direct)
        for values in VALUES:
            moved = here.asarray(values).to(there)
            got = moved.numpy()
            assert got.dtype == values.dtype and got.shape == values.shape
            assert got.tobytes() == np.ascontiguousarray(values).tobytes()
        after = _counters(direct)
    assert after.get("links_granted", 0) - before.get("links_granted", 0) == len(VALUES)
    # ... and the workers say so in their next heartbeats: each move sent and received once
    def reported() -> dict[str, int] | None:
        now = _link_figures(direct)
        return now if min(now["link_sent"] - carried["link_sent"], now["link_received"]
                          - carried["link_received"]) >= len(VALUES) else None
    moved = wait_for(reported, 10, "both workers to report the moves")
    assert moved["link_sent"] - carried["link_sent"] == len(VALUES)
    assert moved["link_received"] - carried["link_received"] == len(VALUES)
    assert moved["link_sent_bytes"] - carried["link_sent_bytes"] \
        == moved["link_received_bytes"] - carried["link_received_bytes"] \
        >= sum(v.nbytes for v in VALUES)
    assert moved["link_fallbacks"] == carried["link_fallbacks"]
    uploads_and_reads = 2 * sum(v.nbytes for v in VALUES)
    # what crossed the broker: each array up and back, and small messages; not the moves
    assert after["traffic"] - before["traffic"] < uploads_and_reads + sum(
        v.nbytes for v in VALUES) // 2


@pytest.mark.parametrize("values", [
    np.random.default_rng(4).random((1024, 1025)),  # 8 MiB and some
    np.asfortranarray(np.arange(3 << 20, dtype=np.int32).reshape(1024, -1)),
    np.arange(1 << 20, dtype=">c16")[::-1],  # swapped bytes, a reversed view
], ids=["float64", "Fortran int32", "big-endian complex view"])
def test_a_large_upload_goes_to_another_host_over_a_direct_link(direct, values):
    with fabric.connect(direct.address, token=direct.token, device=0,
                        shared_memory=False) as session:
        before = _counters(direct)
        tensor = session.asarray(values)
        after = _counters(direct)
        got = (tensor + 0).numpy()
    assert after["links_granted"] == before.get("links_granted", 0) + 1
    assert after["traffic"] - before["traffic"] < values.nbytes // 4  # not the bytes
    assert got.shape == values.shape and np.array_equal(got, values)
    assert got.dtype == values.dtype.newbyteorder("=")


def test_a_large_read_from_another_host_comes_over_a_direct_link(direct):
    values = np.random.default_rng(7).random((1024, 1100))
    with fabric.connect(direct.address, token=direct.token, device=1,
                        shared_memory=False) as session:
        tensor = session.asarray(values) * 2  # (its op still batched: the read waits for it)
        before = _counters(direct)
        got, view = tensor.numpy(), tensor.numpy(copy=False)
        after = _counters(direct)
        broken = np.linalg.inv(session.zeros((1024, 1024)))  # singular: fails on the device
        with pytest.raises(fabric.RemoteError, match="inv"):
            broken.numpy()
    assert after["links_granted"] == before.get("links_granted", 0) + 2
    assert after["traffic"] - before["traffic"] < values.nbytes // 4  # not the bytes
    assert np.array_equal(got, values * 2) and got.flags.writeable
    assert np.array_equal(view, values * 2) and not view.flags.writeable


@pytest.mark.parametrize("values", [np.zeros((0, 3)), np.float64(2.5), np.arange(10)])
def test_small_empty_and_0d_tensors_move_through_the_broker_as_before(direct, values):
    here, there = _sessions(direct)
    with here, there:
        before = _counters(direct).get("links_granted", 0)
        got = here.asarray(values).to(there).numpy()
        assert _counters(direct).get("links_granted", 0) == before
    assert got.shape == np.shape(values) and got.tobytes() == np.asarray(values).tobytes()


def _attack(address: str, curve_server_key: bytes | None, **credentials) -> bool:
    """Whether a raw peer showing ``credentials`` gets a connection to ``address`` (writable
    with IMMEDIATE: its handshake done) within twice the receiver's wait for a ticket. The
    endpoint is reachable (a TCP connection is taken), so a refusal is the handshake's."""
    host, port = address[len("tcp://"):].rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=2).close()
    with zmq.Context() as context, context.socket(zmq.DEALER) as peer:
        peer.linger = 0
        peer.immediate = True
        for option, value in credentials.items():
            setattr(peer, option, value)
        if curve_server_key is not None:
            peer.curve_serverkey = curve_server_key
        peer.connect(address)
        return bool(peer.poll(2000, zmq.POLLOUT))


def _guessed_curve_keys() -> dict[str, bytes]:
    public, secret = zmq.curve_keypair()
    return {"curve_publickey": public, "curve_secretkey": secret}


@pytest.mark.parametrize("credentials", [
    {}, {"plain_username": LINK_USER, "plain_password": b"guess"},
    {"plain_username": LINK_USER, "plain_password": secrets.token_bytes(32)}],
    ids=["no ticket", "a short guess", "a wrong ticket"])
def test_a_peer_without_the_ticket_is_refused_and_the_worker_goes_on(direct, hosts,
                                                                     credentials):
    address = _bulk_address(Path(direct.log_dir), hosts.addresses[1])
    before = _link_refusals(direct)
    assert not _attack(address, None, **credentials)
    # More than the one of _attack's bare TCP probe: a peer showing no credentials is refused
    # by libzmq itself (no ZAP request), seen by the endpoint's monitor, at every retry.
    wait_for(lambda: _link_refusals(direct) > before + 1, 10,  # (at a heartbeat)
             "the refusal in the worker's report (fabric admin workers, /metrics)")
    here, there = _sessions(direct)
    with here, there:
        values = VALUES[0]
        assert here.asarray(values).to(there).numpy().tobytes() == values.tobytes()


def test_an_unreachable_endpoint_falls_back_to_the_broker_and_says_so_once(hosts, tmp_path,
                                                                            caplog):
    # Each worker's endpoint on its own loopback: neither the other host nor this side
    # can reach it.
    with _cluster(hosts, tmp_path, "--bulk-host", "127.0.0.1") as running:
        here, there = _sessions(running)
        with here, there:
            for values in VALUES[:2]:
                assert here.asarray(values).to(there).numpy().tobytes() == values.tobytes()
            large = np.random.default_rng(5).random(DIRECT_BYTES // 8)
            granted = _counters(running)["links_granted"]
            with caplog.at_level(logging.WARNING, "fabric.client"):
                for _ in range(2):  # (the session asks once)
                    assert np.array_equal(there.asarray(large).numpy(), large)
            assert _counters(running)["links_granted"] == granted + 1
            wait_for(lambda: _link_figures(running)["link_fallbacks"] == 2, 10,
                     "the sending worker to report its two moves that fell back")
            assert _link_figures(running)["link_sent"] == 0
        sender = [p for p in tmp_path.iterdir() if hosts.addresses[0] in p.name]
    assert [r.getMessage() for r in caplog.records] == [
        f"no direct link to {_bulk_address(tmp_path, hosts.addresses[1])} within "
        f"{CONNECT_SECONDS:g} s: large uploads there travel through the broker"]
    said = [line for line in sender[0].read_text().splitlines()
            if f"within {CONNECT_SECONDS:g} s" in line]
    assert len(said) == 1 and "travel through the broker" in said[0]


def test_with_curve_the_link_is_encrypted_and_refuses_other_keys(hosts, tmp_path):
    generate_keys(tmp_path / "keys")
    with _cluster(hosts, tmp_path, curve=tmp_path / "keys") as running:
        here, there = _sessions(running)
        with here, there:
            values = VALUES[1]
            before = _counters(running).get("links_granted", 0)
            assert here.asarray(values).to(there).numpy().tobytes() == values.tobytes()
            large = np.random.default_rng(6).random(DIRECT_BYTES // 8)
            assert np.array_equal(there.asarray(large).numpy(), large)
            assert _counters(running)["links_granted"] == before + 3  # move, upload, read
        address = _bulk_address(tmp_path, hosts.addresses[1])
        server_key = zmq.auth.load_certificate(tmp_path / "keys" / "worker.key")[0]
        assert not _attack(address, server_key, **_guessed_curve_keys())
        assert not _attack(address, None,
                           plain_username=LINK_USER, plain_password=secrets.token_bytes(32))


def _local_cluster(hosts: simhosts.SimulatedHosts, log_dir: Path,
                   *worker_args: str) -> fabric.LocalCluster:
    """Two workers on this side, with a broker on the bridge (not on loopback: the workers
    then make direct links by themselves, on the bridge's address)."""
    return fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT, log_dir=log_dir,
                               worker_address=f"tcp://{hosts.bridge_address}:*",
                               worker_args=worker_args)


def _local_sessions(cluster: fabric.LocalCluster) -> list[fabric.Session]:
    return [fabric.connect(cluster.address, token=cluster.token, device=d, shared_memory=False)
            for d in (0, 1)]


def test_bulk_host_none_keeps_every_move_on_the_broker(hosts, tmp_path):
    with _local_cluster(hosts, tmp_path, "--bulk-host", "none") as running:
        here, there = _local_sessions(running)
        with here, there:
            values = VALUES[0]
            assert here.asarray(values).to(there).numpy().tobytes() == values.tobytes()
            counters = _counters(running)
    assert "links_granted" not in counters and counters["traffic"] >= 3 * values.nbytes
    assert not any("direct links at" in p.read_text() for p in tmp_path.iterdir())


def test_a_tensor_moved_over_a_link_counts_against_the_receivers_memory_limit(hosts, tmp_path):
    with _local_cluster(hosts, tmp_path, "--memory-limit", str(4 << 20)) as running:
        here, there = _local_sessions(running)
        with here, there:
            held = there.asarray(np.ones(2 << 17))  # 2 MiB of the 4
            moved = here.asarray(np.ones(LARGE // 8)).to(there)
            with pytest.raises(QuotaExceeded, match="memory-limit"):
                moved.numpy()
            assert held.sum().numpy() == 2 << 17  # the receiving session goes on
            assert _counters(running)["links_granted"] == 1
    assert all(f"direct links at tcp://{hosts.bridge_address}:" in p.read_text()
               for p in tmp_path.iterdir() if p.name.startswith("worker"))


def test_a_direct_link_between_ipv6_addresses(hosts, tmp_path):
    reason = simhosts.ipv6_missing()
    if reason:
        pytest.skip(reason)
    with _cluster(hosts, tmp_path, bulk_hosts=hosts.second.addresses6) as running:
        here, there = _sessions(running)
        with here, there:
            before = _counters(running)
            values = VALUES[0]
            assert here.asarray(values).to(there).numpy().tobytes() == values.tobytes()
            after = _counters(running)
    assert after["links_granted"] == before.get("links_granted", 0) + 1
    assert after["traffic"] - before["traffic"] < 2 * values.nbytes + values.nbytes // 2
    assert _bulk_address(tmp_path, hosts.addresses[1]).startswith(
        f"tcp://[{hosts.second.addresses6[1]}]:")  # (what the grant named)


def _sending_on(second: simhosts.SecondNetwork, member: int, peer: str) -> bool:
    """Whether ``member`` of the second network has bytes queued on a TCP connection to
    ``peer``."""
    namespace = second.ends[member][0]
    listed = subprocess.run([*(["ip", "netns", "exec", namespace] if namespace else []), "ss",
                             "-Htn", "state", "established", "dst", peer],
                            capture_output=True, text=True, timeout=10).stdout
    return any(int(line.split()[1]) > 0 for line in listed.splitlines())


def _cut_mid_send(second: simhosts.SecondNetwork, sender: int, receiver: int,
                  work: Callable[[], Any], cut: Callable[[], None] | None = None) -> Any:
    """``work()``'s result, run in a thread while what ``sender`` sends on the second network
    is slowed; once its bytes to ``receiver`` are under way, ``cut()`` (by default
    ``receiver``'s link is cut; the first network, and the broker, stay)."""
    if shutil.which("tc") is None:
        pytest.skip("tc is missing (apt-get install iproute2): a link cannot be slowed")
    second.slow(sender, 40)  # (24 MiB: about 5 s)
    with ThreadPoolExecutor(1) as worker:
        working = worker.submit(work)
        wait_for(lambda: _sending_on(second, sender, second.addresses[receiver])
                 or working.done(), 20, "the bytes under way on the second network")
        (cut or (lambda: second.set_up(receiver, False)))()
        return working.result(timeout=LINK_STALL_SECONDS + 30)


def _held_once(cluster: SSHCluster, session: fabric.Session, nbytes: int) -> None:
    """Wait until ``session``'s device reports holding ``nbytes`` (one copy, not two)
    beside its own pool's shared memory (a segment kept ready for a start slot)."""
    def held() -> int | None:
        with cluster.admin() as admin:
            return next((row["resident_bytes"] or 0) - (row["pool_bytes"] or 0)
                        for row in admin.devices()
                        if row["index"] == session.device.index)
    wait_for(lambda: held() == nbytes, 10, f"{nbytes} bytes held on the device, once")


def _move_and_read(cluster: SSHCluster, elements: int) -> np.ndarray:
    """``arange(elements)`` made on host 0's device, moved to host 1's, held there once, and
    read back (sessions are used by the thread that connects them: this runs in its own)."""
    here, there = _sessions(cluster)
    with here, there:
        moved = here.arange(elements, dtype="float64").to(there)
        _held_once(cluster, there, moved.nbytes)
        return moved.numpy()


def test_a_link_cut_mid_send_is_retried_through_the_broker_once_logged(hosts, tmp_path):
    elements = 3 << 20
    try:
        with _cluster(hosts, tmp_path, bulk_hosts=hosts.second.addresses) as running:
            got = _cut_mid_send(hosts.second, 0, 1, lambda: _move_and_read(running, elements))
            assert _counters(running)["links_granted"] >= 1  # (the read's too: it falls back)
        sender = [p for p in tmp_path.iterdir() if hosts.addresses[0] in p.name]
    finally:
        hosts.second.reset()
    assert got.tobytes() == np.arange(elements, dtype=np.float64).tobytes()
    said = [line for line in sender[0].read_text().splitlines() if "broke before" in line]
    assert len(said) == 1 and f"{_bulk_address(tmp_path, hosts.addresses[1])}" in said[0]


def _upload_and_read(cluster: SSHCluster, values: np.ndarray) -> np.ndarray:
    """``values`` uploaded to host 1's device, held there once, and read back, in this
    thread's session."""
    here, there = _sessions(cluster)
    with here, there:
        uploaded = there.asarray(values)
        _held_once(cluster, there, values.nbytes)
        return uploaded.numpy()


def test_an_upload_whose_link_is_cut_mid_send_goes_through_the_broker_once_logged(
        hosts, tmp_path, caplog):
    values = np.random.default_rng(9).random(3 << 20)
    try:
        with _cluster(hosts, tmp_path, bulk_hosts=hosts.second.addresses) as running, \
                caplog.at_level(logging.WARNING, "fabric.client"):
            got = _cut_mid_send(hosts.second, simhosts.THIS_SIDE, 1,
                                lambda: _upload_and_read(running, values))
    finally:
        hosts.second.reset()
    assert got.tobytes() == values.tobytes()
    said = [r.getMessage() for r in caplog.records if "broke before" in r.getMessage()]
    assert said == [f"the direct link to {_bulk_address(tmp_path, hosts.addresses[1])} broke "
                    "before the worker took the upload: sent again through the broker (so "
                    "are the next that break there)"]


def _read(cluster: SSHCluster, elements: int) -> np.ndarray:
    """``arange(elements)`` made on host 1's device and read back, in this thread's session."""
    here, there = _sessions(cluster)
    with here, there:
        return there.arange(elements, dtype="float64").numpy()


def test_a_read_whose_link_is_cut_mid_send_comes_through_the_broker_once_logged(
        hosts, tmp_path, caplog):
    elements = 3 << 20
    try:
        with _cluster(hosts, tmp_path, bulk_hosts=hosts.second.addresses) as running, \
                caplog.at_level(logging.WARNING, "fabric.client"):
            got = _cut_mid_send(hosts.second, 1, simhosts.THIS_SIDE,
                                lambda: _read(running, elements))
    finally:
        hosts.second.reset()
    assert got.tobytes() == np.arange(elements, dtype=np.float64).tobytes()
    said = [r.getMessage() for r in caplog.records if "broke before" in r.getMessage()]
    assert said == [f"the direct link to {_bulk_address(tmp_path, hosts.addresses[1])} broke "
                    "before the read's values came: sent again through the broker (so are "
                    "the next that break there)"]


def _kill_worker(hosts: simhosts.SimulatedHosts, host: int) -> None:
    """SIGKILL to the worker on host ``host``."""
    for pid in hosts.pids(host):
        with contextlib.suppress(OSError):
            if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                os.kill(pid, signal.SIGKILL)


def test_a_receiver_killed_mid_send_loses_its_session_and_nothing_hangs(hosts, tmp_path):
    try:
        with _cluster(hosts, tmp_path, bulk_hosts=hosts.second.addresses) as running:
            with pytest.raises(SessionLost):
                _cut_mid_send(hosts.second, 0, 1, lambda: _move_and_read(running, 3 << 20),
                              lambda: _kill_worker(hosts, 1))
    finally:
        hosts.second.reset()
