"""A device's own pool makes its segments on a thread of its own (``fabric.core.segment_maker``,
``workers.device_pool``): a slot request that no free segment fits is answered once its segment
is made, its bytes counted against the budget and the limits from the start, and the device's
thread is never held up meanwhile; the segment kept ready for the next start slot is made once
the device idles. The device's rules, sans I/O (end to end, the shared-memory tests of
``test_shm_path``, ``test_shm_ahead`` and ``test_start_slot`` take the same path)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from fabric.core.cross_memory import WarmMemory
from fabric.core.protocol import Kind, Message
from fabric.core.segment_maker import SegmentMaker
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import Segment, boot_id, parse_name
from fabric.workers import device_pool, shared_memory
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor
from fabric.workers.memory import MemoryBudget

from polling import wait_for

MiB = 1 << 20


def agreed_session(monkeypatch, executor: Executor) -> SegmentPool:
    """Session 7 opened on ``executor``, agreed to shared memory with this process (playing
    its client, whose pool this returns)."""
    monkeypatch.setattr(shared_memory, "_worker_pid", lambda: 1)
    executor.handle(Message(Kind.OPEN, 7, 1, {"device": 0}))
    client = SegmentPool(lambda _session: 0)
    probe = client.probe_segment(5)
    [agreed] = executor.handle(Message(Kind.REQUEST, 7, 2, {
        "op": "shm_probe", "boot": boot_id(), "segment": probe.name, "token": 5}))
    assert agreed.body == {"shared_memory": True, "reads_memory": False}  # (no "heap" named)
    probe.close()
    return client


@pytest.fixture
def gated(monkeypatch):
    """An executor (a budget of 12 MiB, a session limit of 20) with a session agreed to shared
    memory with this process, whose pool's maker waits at ``gate`` before it faults a
    segment in."""
    executor = Executor(NumpyDevice(0), memory_limit=20 * MiB, budget=MemoryBudget(12 * MiB))
    client = agreed_session(monkeypatch, executor)
    gate, allocate = threading.Event(), Segment.allocate

    def allocate_at_the_gate(segment: Segment) -> None:
        if threading.current_thread().name == "fabric-segment-maker":
            assert gate.wait(10)
        allocate(segment)

    monkeypatch.setattr(Segment, "allocate", allocate_at_the_gate)
    try:
        yield executor, gate
    finally:
        gate.set()
        executor.handle(Message(Kind.CLOSE, 7, 3))
        client.close()
        if executor.slots is not None:
            executor.slots.close()


def _ask(executor: Executor, request: int, nbytes: int) -> list[Message]:
    return executor.handle(Message(Kind.REQUEST, 7, request, {"op": "shm_slot",
                                                              "nbytes": nbytes}))


@pytest.mark.timeout(60)
def test_a_slot_being_made_counts_against_the_budget_and_the_limits_from_the_start(gated):
    executor, gate = gated
    assert _ask(executor, 10, 8 * MiB) == []  # answered once made
    pool = executor.slots
    assert pool.held == 8 * MiB and executor.allowance.held == 8 * MiB
    assert executor.sessions[7].segments.charged == 8 * MiB  # the session's
    [refused] = _ask(executor, 11, 14 * MiB)  # 8 + 14 > 20: the session's limit
    assert refused.body["slot"] is None and "--memory-limit" in refused.body["reason"]
    assert _ask(executor, 12, 2 * MiB) == []  # 10: within both
    [refused] = _ask(executor, 13, 4 * MiB)  # 10 + 4 > 12: the worker's budget
    assert refused.body["slot"] is None and "--memory-budget" in refused.body["reason"]
    assert pool.held == 10 * MiB and executor.allowance.held == 10 * MiB
    gate.set()
    answers: list[Message] = []
    while len(answers) < 2:
        answers += wait_for(lambda: device_pool.made(executor) or None, 10, "the slots made")
    assert [answer.request for answer in answers] == [10, 12]
    names = [answer.body["slot"][0] for answer in answers]
    assert all(parse_name(name).pid == os.getpid() for name in names)
    assert executor.allowance.held == 10 * MiB and pool.held == 10 * MiB  # (unchanged)


@pytest.mark.timeout(60)
def test_a_session_closed_while_its_slot_is_made_leaves_it_free_and_unanswered(gated):
    executor, gate = gated
    assert _ask(executor, 10, 8 * MiB) == []
    executor.handle(Message(Kind.CLOSE, 7, 3))
    gate.set()
    wait_for(lambda: (device_pool.made(executor) == [], executor.slots.free)[1], 10,
             "the segment made")
    pool = executor.slots
    assert len(pool.free) == 1 and not pool.lent and executor.allowance.held == 8 * MiB


@pytest.mark.timeout(30)
def test_a_job_handed_first_runs_before_those_waiting_and_close_runs_none_after():
    running, gate, order = threading.Event(), threading.Event(), []

    class Job:
        def __init__(self, name: str) -> None:
            self.name = name

        def allocate(self) -> None:
            if self.name == "gated":
                running.set()
                assert gate.wait(10)
            order.append(self.name)

    maker = SegmentMaker()
    try:
        events = [maker.submit(Job("gated"))]
        assert running.wait(10)  # (the others wait behind it)
        events += [maker.submit(Job(name)) for name in ("ahead", "later")]
        events.append(maker.submit(Job("slot"), first=True))
        gate.set()
        assert all(event.wait(10) for event in events)
        assert order == ["gated", "slot", "ahead", "later"]
        assert [job.name for job, failed in maker.done] == order
    finally:
        maker.close()
    closed = maker.submit(Job("after close"))  # (its pool closed: failed, not faulted in)
    assert closed.wait(10) and maker.done[-1][1] is not None and "after close" not in order
    maker.close()


@pytest.mark.timeout(60)
def test_the_next_start_slots_segment_is_made_once_the_device_idles_not_as_one_is_lent(
        monkeypatch):
    executor = Executor(NumpyDevice(0), sharing=shared_memory.HostSharing(start_slot=4 * MiB))
    client = agreed_session(monkeypatch, executor)
    try:
        device_pool.ready_for_start(executor)  # (the device starts: one made at once)
        pool = executor.slots
        wait_for(lambda: (pool.reclaim(), pool.free)[1], 10, "the segment kept ready")
        assert device_pool.idle_wait_ms(executor) == -1  # (nothing to do when idle)
        [lent] = executor.handle(Message(Kind.REQUEST, 7, 3, {
            "op": "shm_slot", "nbytes": 4 * MiB, "start": True}))
        assert lent.body["slot"] is not None and not pool.free
        # the next is not made while the session that just began works, but once the
        # device waited READY_AFTER_IDLE_MS for work
        assert not pool.being_made(4 * MiB)
        assert device_pool.idle_wait_ms(executor) == device_pool.READY_AFTER_IDLE_MS
        device_pool.idle(executor)
        assert pool.being_made(4 * MiB) and device_pool.idle_wait_ms(executor) == -1
        wait_for(lambda: (pool.reclaim(), pool.free)[1], 10, "the next segment kept ready")
    finally:
        executor.handle(Message(Kind.CLOSE, 7, 4))
        client.close()
        if executor.slots is not None:
            executor.slots.close()


@pytest.mark.timeout(60)
def test_what_a_pool_makes_ahead_of_a_need_is_made_at_the_lowest_priority(monkeypatch):
    niceness: dict[Any, int] = {}  # segment size, or "warm" -> its maker thread's nice
    allocate, warm = Segment.allocate, WarmMemory.allocate

    def allocate_noting_priority(segment: Segment, copies=None) -> None:
        niceness[segment.size] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        allocate(segment, copies)

    def warm_noting_priority(block: WarmMemory) -> None:
        niceness["warm"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        warm(block)

    monkeypatch.setattr(Segment, "allocate", allocate_noting_priority)
    monkeypatch.setattr(WarmMemory, "allocate", warm_noting_priority)
    pool = SegmentPool(lambda _session: 0)
    try:
        here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        pool.make_ahead(4 * MiB)  # (a size's next read: it may never come)
        pool.warm_ahead(2 * MiB)
        wait_for(lambda: (pool.reclaim(), pool.free and pool.warm)[1], 10, "both made ahead")
        assert niceness == {4 * MiB: 19, "warm": 19}
        slot = pool.acquire(6 * MiB)  # a slot needed now: made on the caller's thread
        assert niceness[6 * MiB] == here
        pool.give_back(slot)
    finally:
        pool.close()
