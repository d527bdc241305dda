"""When a worker's devices all idle (``workers.heap.IdleRule``), sans I/O: its heap's free
memory goes back then, never while one works."""

from __future__ import annotations

import pytest

from workers.heap import Heap, IdleRule

pytestmark = pytest.mark.timeout(10)


def test_a_device_idles_once_it_ran_nothing_between_two_heartbeats():
    rule = IdleRule(devices=1)
    assert rule.all_idle(0, 0.0) is True  # (a worker that never ran anything)
    assert rule.all_idle(0, 1.5) is False  # (ran since the last)
    assert rule.all_idle(0, 2.0) is False
    assert rule.all_idle(0, 2.0) is True
    assert rule.all_idle(0, 2.0) is True
    assert rule.all_idle(0, 2.5) is False


def test_no_device_idles_while_another_of_the_worker_works():
    rule = IdleRule(devices=2)
    assert rule.all_idle(0, 1.0) is False
    assert rule.all_idle(1, 3.0) is False
    assert rule.all_idle(0, 1.0) is False  # (device 1 ran between its last two)
    assert rule.all_idle(1, 4.0) is False
    assert rule.all_idle(0, 1.0) is False
    assert rule.all_idle(1, 4.0) is True  # (neither ran since its last)
    assert rule.all_idle(0, 1.0) is True


def test_an_operators_own_top_pad_stands():
    tunables = "glibc.malloc.arena_max=1:glibc.malloc.top_pad=0"
    assert Heap(1, 0, environ={"GLIBC_TUNABLES": tunables}).keeps is False
