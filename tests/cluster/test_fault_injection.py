"""Fault injection: messages dropped, delayed and held between broker and worker, processes
paused (SIGSTOP) and killed, while clients keep calling.

The invariant, checked on every call by ``faultproxy.ClientLoop``: each call returns the
right value or raises a typed ``FabricError`` within its deadline (twice its timeout, for the
send and the answer, plus a second of slack); nothing hangs. Afterwards nothing is left: no
session on the broker (``fabric.Admin``), none and no memory on any device
(``session.stats()``), no socket of this process (file descriptors), no thread or child
process (the ``no_leaks`` fixture).

Worker 1 reaches the broker through a ``FaultProxy``; worker 0 is connected directly, and
its sessions are the bystanders that must never notice the faults on worker 1's link.
"""

from __future__ import annotations

import contextlib

import random
import signal
import time

import pytest
from faultproxy import ClientLoop, FaultProxy, open_fds, start_worker_via, stopped
from polling import wait_for

import fabric
from conftest import HEARTBEAT
from fabric.core.protocol import Kind

TIMEOUT = 2.0  # each session's request timeout
DEADLINE = 2 * TIMEOUT + 1.0  # a call may wait to send, then for its answer
LIVENESS = 3 * HEARTBEAT  # the broker loses a worker it has not heard from for this long


@pytest.fixture
def proxied():
    """A broker, worker-0 on its port for workers, and worker-1 behind a FaultProxy."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT, broker_args=(
            "--open-timeout", "1", "--lease", "1")) as cluster, \
            FaultProxy(cluster.worker_address, cluster.worker_token) as proxy:
        start_worker_via(cluster, 1, proxy.address)
        cluster.wait_for_devices(2)
        yield cluster, proxy


def loop_on(cluster: fabric.LocalCluster, device: int, seed: int, **options) -> ClientLoop:
    return ClientLoop(lambda: cluster.connect(device=device, timeout=TIMEOUT),
                      deadline=DEADLINE, seed=seed, **options)


def assert_nothing_left(cluster: fabric.LocalCluster, fds: int) -> None:
    """No session on the broker or any device, no device memory, no socket of ours left."""
    with cluster.admin() as admin:
        wait_for(lambda: admin.sessions() == [], 10, "the broker to hold no session")
    for device in range(len(cluster.workers)):
        with cluster.connect(device=device, timeout=5) as checker:
            # A session whose CLOSE was lost is closed by the next heartbeat, which lists
            # the sessions the broker still holds on that worker.
            wait_for(lambda: checker.stats()["device_sessions"] == 1, 10,
                     f"device {device} to hold only the checker's session")
            assert checker.stats()["device_resident_bytes"] == 0
    wait_for(lambda: open_fds() <= fds, 10, "this process's sockets to close")


# With every 7th message lost, about one lossy call in five is right (most sessions lose a
# message within a call or two): a loop runs until 25 calls and 2 right answers, which a few
# dozen calls give (25 calls alone gave 0 right in 2 runs of 28).
LOSSY_RIGHT, LOSSY_MAX_CALLS = 2, 80


@pytest.mark.timeout(180)
def test_dropping_every_nth_message_either_way_keeps_the_invariant(proxied):
    cluster, proxy = proxied
    fds = open_fds()
    proxy.drop_every = 7
    with loop_on(cluster, 1, seed=1, max_calls=LOSSY_MAX_CALLS) as lossy, \
            loop_on(cluster, 1, seed=2, max_calls=LOSSY_MAX_CALLS) as lossy_too, \
            loop_on(cluster, 0, seed=3, pause=0.01) as bystander:
        lossy.wait(25, timeout=150, right=LOSSY_RIGHT)
        lossy_too.wait(25, timeout=150, right=LOSSY_RIGHT)
    proxy.heal()
    assert proxy.counts["to_worker_dropped"] and proxy.counts["to_broker_dropped"]
    for outcomes in (lossy.outcomes, lossy_too.outcomes):
        outcomes.check(at_least_right=LOSSY_RIGHT)
    bystander.outcomes.check(at_least_right=5)
    assert not bystander.outcomes.typed, bystander.outcomes.typed
    with cluster.connect(device=1, timeout=5) as healed:  # the link works again
        assert healed.arange(4).sum().numpy() == 6
    assert_nothing_left(cluster, fds)


def test_delayed_messages_only_slow_calls_down(proxied):
    cluster, proxy = proxied
    fds = open_fds()
    proxy.delay = 0.05  # each way: well inside the heartbeat liveness window
    with loop_on(cluster, 1, seed=4, max_calls=20) as delayed:
        delayed.wait(20, timeout=30)
    outcomes = delayed.stop()
    outcomes.check(at_least_right=10)
    assert not outcomes.typed, outcomes.typed
    assert proxy.counts["to_worker_forwarded"] and not proxy.counts["to_worker_dropped"]
    assert_nothing_left(cluster, fds)


@contextlib.contextmanager
def held(proxy):
    """The worker's link held by the proxy for the ``with`` block."""
    proxy.hold()
    try:
        yield
    finally:
        proxy.release()


@pytest.mark.parametrize("interruption", ["link held", "worker stopped"])
def test_an_interruption_shorter_than_the_liveness_window_loses_nothing(proxied, interruption):
    cluster, proxy = proxied
    fds = open_fds()
    device, seed = (1, 5) if interruption == "link held" else (0, 8)
    with loop_on(cluster, device, seed=seed, pause=0.02) as interrupted:
        for _ in range(3):
            interrupted.wait(interrupted.outcomes.calls + 3, timeout=10)
            with held(proxy) if interruption == "link held" else stopped(cluster.workers[0]):
                time.sleep(LIVENESS / 2)
        interrupted.wait(interrupted.outcomes.calls + 3, timeout=10)
    interrupted.outcomes.check(at_least_right=5)
    assert not interrupted.outcomes.typed, interrupted.outcomes.typed
    assert_nothing_left(cluster, fds)


def test_a_link_held_past_the_liveness_window_is_waited_for_and_heals(proxied):
    # The proxy holds the messages, not the transport: libzmq's heartbeats between it and
    # the worker's beacon go on, so the worker is busy, not gone (a cut transport is
    # test_liveness's partition). Its calls time out, typed, and work again once it is free.
    cluster, proxy = proxied
    fds = open_fds()
    with loop_on(cluster, 1, seed=6, pause=0.02) as held_up, \
            loop_on(cluster, 0, seed=7, pause=0.02) as bystander:
        held_up.wait(3, timeout=10)
        registered = proxy.received[Kind.REGISTER]
        with held(proxy):
            time.sleep(LIVENESS + DEADLINE)  # past the old window, and a call's deadline
            assert [d.worker for d in cluster.devices()] == ["worker-0", "worker-1"]
        held_up.wait(held_up.outcomes.calls + 3, timeout=15, right=held_up.outcomes.right + 2)
        bystander.wait(bystander.outcomes.calls + 3, timeout=10)
        assert proxy.received[Kind.REGISTER] == registered  # never lost, never re-registered
        with cluster.admin() as admin:
            assert admin.status()["counters"].get("workers_lost", 0) == 0
    held_up.outcomes.check(at_least_right=4)
    assert held_up.outcomes.typed, "the held link should have timed a call out"
    # A call times out, and so does the open of the next session (--open-timeout); neither
    # says the worker was lost (SessionLost, DeviceOffline).
    assert set(held_up.outcomes.typed) <= {"RequestTimeout", "HandshakeError",
                                           "HandshakeTimeout"}, held_up.outcomes.typed
    bystander.outcomes.check(at_least_right=3)
    assert not bystander.outcomes.typed, bystander.outcomes.typed
    assert_nothing_left(cluster, fds)


def test_a_stopped_broker_fails_calls_typed_and_everything_comes_back(proxied):
    cluster, _ = proxied
    fds = open_fds()
    with loop_on(cluster, 0, seed=9, pause=0.02) as direct, \
            loop_on(cluster, 1, seed=10, pause=0.02) as behind_proxy:
        direct.wait(3, timeout=10)
        behind_proxy.wait(3, timeout=10)
        with stopped(cluster.broker):
            time.sleep(1.5)  # past the workers' liveness: they reconnect by themselves
        # Back, each loop's calls are right again. (Not "so many more calls": until the broker
        # has found the old links gone and the workers registered again, which may come after
        # the devices are listed, its calls are answered DeviceOffline, a typed refusal.)
        for loop in (direct, behind_proxy):
            loop.wait(0, timeout=15, right=loop.outcomes.right + 3)
    for loop in (direct, behind_proxy):
        loop.outcomes.check(at_least_right=6)
    assert_nothing_left(cluster, fds)


def test_a_random_schedule_of_faults_keeps_the_invariant(proxied):
    """Drops, delays, held links, paused and killed workers, one after another (seeded)."""
    cluster, proxy = proxied
    fds = open_fds()
    rng = random.Random(2024)
    faults = []
    with loop_on(cluster, 0, seed=11, pause=0.01) as first, \
            loop_on(cluster, 1, seed=12, pause=0.01) as second:
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            fault = rng.choice(["drop", "delay", "hold", "stop", "kill", "none"])
            faults.append(fault)
            if fault == "drop":
                proxy.drop_every = rng.choice([3, 5, 11])
            elif fault == "delay":
                proxy.delay = rng.choice([0.01, 0.05, 0.1])
            elif fault == "hold":
                proxy.hold()
            elif fault == "stop":
                with stopped(cluster.workers[1]):
                    time.sleep(rng.choice([0.1, LIVENESS + 0.2]))
            elif fault == "kill":
                victim = rng.randrange(2)
                cluster.workers[victim].send_signal(signal.SIGKILL)
                cluster.workers[victim].wait(5)
                if victim:
                    start_worker_via(cluster, 1, proxy.address)
                else:
                    cluster.start_worker(0)
            time.sleep(rng.choice([0.2, 0.5, 0.8]))
            proxy.heal()
        cluster.wait_for_devices(2, timeout=15)
        first.wait(first.outcomes.calls + 2, timeout=15)
        second.wait(second.outcomes.calls + 2, timeout=15)
    assert len(set(faults)) >= 4, faults
    for loop in (first, second):
        loop.outcomes.check(at_least_right=3)
    assert_nothing_left(cluster, fds)
