"""A message is bounded in total before it is read into memory, for a peer holding a token as
for one without: the attack of issue 41, section 2, findings 2 and 3, against real processes.

libzmq bounds each frame (MAXMSGSIZE) and holds a multipart message whole before the first
frame can be read, so many frames each under the limit used to be held in full: 12 frames of
256 MiB made the broker (on its client port) and a worker (on a direct link) run out of
memory. Here the attack is scaled to frames of 8 MiB (the processes' ``--max-message-bytes``)
and about 2 GiB in all, which the unfixed processes held (a 24 GiB machine survives it); the
fixed ones cut the connection once it holds more than ``connection_bytes_limit`` unread,
which their peak resident memory (``VmHWM``) shows, and everyone else goes on.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

import fabric
from fabric.core.flow import connection_bytes_limit
from fabric.core.intake import IntakeLedger, Reading
from fabric.core.protocol import Kind, Message
from fabric.core.security import present_token, show_ticket

from conftest import HEARTBEAT
from rawpeers import frames_of

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
FRAME = 8 * MiB  # each frame within the processes' frame limit
FRAMES = 256  # 2 GiB in all, in one message that never ends
HELD = connection_bytes_limit(FRAME)  # what a connection may hold unread: 276 MiB
SLACK = 256 * MiB  # what a peer may send past it between two checks, on a loaded machine


@pytest.fixture(scope="module")
def eight_mib():
    """A broker and two workers taking frames of 8 MiB at most; direct links on loopback."""
    size = ("--max-message-bytes", str(FRAME))
    with fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT, broker_args=size,
                             worker_args=(*size, "--bulk-host", "127.0.0.1")) as running:
        yield running


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


def peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmHWM:"))


class Attacker:
    """A DEALER that sends one message of FRAMES frames of FRAME bytes, each within the frame
    limit (libzmq sends a message once it is whole, then frame by frame); ``cut`` says
    whether the server closed the connection."""

    def __init__(self, address: str, show: callable) -> None:
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 60_000)  # (not again, once cut)
        show(self.socket)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.socket.connect(address)

    def send(self, first: list[bytes]) -> None:
        block = memoryview(bytes(FRAME))  # (one buffer, sent FRAMES times without a copy)
        for frame in first:
            self.socket.send(frame, zmq.SNDMORE)
        for _ in range(FRAMES - 1):
            self.socket.send(block, zmq.SNDMORE, copy=False)
        self.socket.send(block, copy=False)

    def cut(self, timeout: float) -> bool:
        return bool(self.monitor.poll(int(timeout * 1000)))

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)


def mount(pid: int, address: str, show: callable, first: list[bytes]) -> None:
    """Send the message to ``address``; check the process ``pid`` cut it within its bound
    (before it was whole), its peak memory grown by at most the bound and a check's slack."""
    reset_peak(pid)
    before = peak(pid)
    attacker = Attacker(address, show)
    try:
        started = time.monotonic()
        attacker.send(first)
        assert attacker.cut(30), "the connection was not cut"
        elapsed = time.monotonic() - started
    finally:
        attacker.close()
    grown = peak(pid) - before
    assert grown < HELD + SLACK, f"peak memory grew by {grown >> 20} MiB in {elapsed:.1f} s"


def bystanders_go_on(cluster: fabric.LocalCluster, session: fabric.Session) -> None:
    assert session.arange(4.0).sum().numpy() == 6.0
    with cluster.connect(device=1) as other:
        assert other.asarray(np.ones(1000)).sum().numpy() == 1000.0
    assert cluster.broker.poll() is None
    assert all(worker.poll() is None for worker in cluster.workers)


def test_a_message_of_many_frames_to_the_client_port_is_cut_before_it_is_whole(eight_mib):
    # Finding 2: one SUBMIT of 12 frames of 256 MiB (each under the 1 GiB frame limit) to
    # the broker's client port, from a peer holding a client token: broker OOM.
    cluster = eight_mib
    with cluster.connect() as session:
        mount(cluster.broker.pid, cluster.address,
              lambda sock: present_token(sock, "client", cluster.token),
              frames_of(Kind.SUBMIT, session=session.id, request=1))
        bystanders_go_on(cluster, session)
    with cluster.admin() as admin:
        assert admin.status()["counters"]["connections_cut"] >= 1
    assert "held more than" in cluster.log_tail("broker", 200)


def test_a_message_of_many_frames_to_the_workers_port_is_cut_before_it_is_whole(eight_mib):
    # The same message on the workers' port, from a peer holding the worker token.
    cluster = eight_mib
    with cluster.connect() as session:
        mount(cluster.broker.pid, cluster.worker_address,
              lambda sock: present_token(sock, "worker", cluster.worker_token),
              frames_of(Kind.HEARTBEAT))
        bystanders_go_on(cluster, session)


def test_a_message_of_many_frames_on_a_direct_link_is_cut_before_it_is_whole(eight_mib):
    # Finding 3: the same message on a direct link granted for the insider's own session:
    # worker OOM.
    cluster = eight_mib
    with cluster.connect() as session:
        answer = session.connection.request(Message(Kind.LINK, session.id, 0, {
            "source": session.id, "nbytes": FRAME}), 5.0, session=session.id)
        assert answer.kind == Kind.LINK_GRANT and "address" in answer.body, answer
        worker = cluster.workers[session.device.index].pid
        mount(worker, answer.body["address"],
              lambda sock: show_ticket(sock, answer.body["ticket"], None),
              frames_of(Kind.TRANSFER, {"ticket": 1}, session=session.id,
                        request=session.id))
        bystanders_go_on(cluster, session)


# -- the accounts on their own (sans I/O: descriptors read from a table) ---------------------


class _Frame:
    """A received frame as the ledger sees one: its size, and its connection (``SRCFD``)."""

    fd = 7

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def get(self, option: int) -> int:
        assert option == zmq.SRCFD
        return self.fd

    @property
    def bytes(self) -> bytes:  # (the routing id's frame, the first, says who sent it)
        return f"peer of {self.fd}".encode()


class _Kernel:
    """What the ledger's probe reads: per descriptor its socket's inode and the bytes libzmq
    took; and the cuts it made."""

    def __init__(self) -> None:
        self.sockets: dict[int, list[int]] = {}  # fd -> [inode, taken]
        self.cut: list[tuple[int, int]] = []

    def probe(self, fd: int):
        if fd not in self.sockets:
            return None
        inode, taken = self.sockets[fd]
        return Reading(inode, taken), f"peer-{fd}"

    def cut_fd(self, fd: int, inode: int) -> bool:
        self.cut.append((fd, inode))
        return True


LIMIT = 10_000_000


def ledger() -> tuple[IntakeLedger, _Kernel]:
    kernel = _Kernel()
    return IntakeLedger(LIMIT, kernel.probe, kernel.cut_fd), kernel


def deliver(accounts: IntakeLedger, kernel: _Kernel, fd: int, sizes: list[int]) -> None:
    """A message of frames of ``sizes`` taken by libzmq from ``fd`` and delivered."""
    kernel.sockets[fd][1] += sum(sizes) + 9 * len(sizes)  # (ZMTP's frame headers)
    _Frame.fd = fd
    accounts.took([_Frame(size) for size in sizes])


def test_a_message_in_progress_past_the_bound_is_cut_and_delivered_ones_never_count():
    accounts, kernel = ledger()
    kernel.sockets[7] = [100, 300]  # accepted: its handshake taken
    accounts.on_event(zmq.EVENT_ACCEPTED, 7)
    assert accounts.check(0.0) == []
    for step in range(1, 200):  # 20 MB a step, all of it delivered: nothing is held
        deliver(accounts, kernel, 7, [22, 200, 20_000_000])
        assert accounts.check(step * 0.05) == [], step
    kernel.sockets[7][1] += LIMIT // 2  # a message in progress: watched closely from now
    assert accounts.check(10.1) == [] and accounts.due() == pytest.approx(10.105)
    kernel.sockets[7][1] += LIMIT // 2 + 1000
    [cut] = accounts.check(10.105)
    assert cut.peer == "peer-7" and LIMIT < cut.held < LIMIT + 2000
    assert kernel.cut == [(7, 100)] and 7 not in accounts.connections


def test_a_connection_found_late_counts_what_it_took_before():
    accounts, kernel = ledger()
    kernel.sockets[9] = [200, 3 * LIMIT]  # its monitor event read after it took 30 MB
    accounts.on_event(zmq.EVENT_ACCEPTED, 9)
    assert [cut.peer for cut in accounts.check(0.0)] == ["peer-9"]


def test_an_idle_connection_and_its_heartbeats_never_add_up_to_a_cut():
    accounts, kernel = ledger()
    kernel.sockets[7] = [100, 300]
    accounts.on_event(zmq.EVENT_ACCEPTED, 7)
    for second in range(0, 30 * 86_400, 60):  # a month of PINGs, 50 bytes a second
        kernel.sockets[7][1] += 50 * 60
        assert accounts.check(float(second)) == []
    assert accounts.connections[7].held == 0


def test_a_descriptor_libzmq_closed_and_reused_is_a_new_connection():
    accounts, kernel = ledger()
    kernel.sockets[7] = [100, 300]
    accounts.on_event(zmq.EVENT_ACCEPTED, 7)
    deliver(accounts, kernel, 7, [5_000_000] * 4)
    assert accounts.check(0.0) == []
    kernel.sockets[7] = [101, 500]  # closed, and its number given to another connection
    assert accounts.check(1.0) == [] and accounts.check(2.0) == []
    assert accounts.connections[7].inode == 101
    kernel.sockets[7][1] += LIMIT + 10_000  # whose message in progress counts from its start
    assert [c.held > LIMIT for c in accounts.check(3.0)] == [True]
    assert kernel.cut == [(7, 101)]


def test_a_descriptor_not_of_this_socket_is_never_watched_or_cut():
    accounts, kernel = ledger()
    accounts.on_event(zmq.EVENT_ACCEPTED, 5)  # (gone, or another socket's, by the check)
    _Frame.fd = 5
    accounts.took([_Frame(10)])
    assert accounts.check(0.0) == [] and accounts.connections == {} and kernel.cut == []
    assert accounts.credits == {}


def test_a_connection_gone_names_its_peer_once():
    accounts, kernel = ledger()
    kernel.sockets[7] = [100, 300]
    accounts.on_event(zmq.EVENT_ACCEPTED, 7)
    deliver(accounts, kernel, 7, [22, 10])
    assert accounts.on_event(zmq.EVENT_DISCONNECTED, 7) == b"peer of 7"
    assert accounts.on_event(zmq.EVENT_CLOSED, 7) is None  # (said once)
    assert accounts.on_event(zmq.EVENT_DISCONNECTED, 8) is None  # (sent nothing: unknown)


def test_the_sender_of_a_message_not_allowed_is_cut():
    accounts, kernel = ledger()
    kernel.sockets[7] = [100, 300]
    deliver(accounts, kernel, 7, [22, 10])
    assert accounts.cut_sender([_Frame(0)], 0.0) and kernel.cut == [(7, 100)]


def test_a_connection_just_accepted_is_read_at_once_without_reading_all_the_others():
    accounts, kernel = ledger()
    for fd in range(10, 110):
        kernel.sockets[fd] = [fd, 300]
        accounts.on_event(zmq.EVENT_ACCEPTED, fd)
    accounts.check(0.0)  # (every one read)
    probed = []
    kernel.probe = lambda fd, read=kernel.probe: probed.append(fd) or read(fd)
    accounts.probe = kernel.probe
    kernel.sockets[200] = [200, 3 * LIMIT]  # a newcomer that sends at once
    accounts.on_event(zmq.EVENT_ACCEPTED, 200)
    assert accounts.due() == 0.0
    assert [cut.peer for cut in accounts.check(0.01)] == ["peer-200"]
    assert set(probed) == {200}  # (an accept flood costs a read per newcomer, no more)
