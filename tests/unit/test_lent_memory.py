"""The rules of a tensor lent by memory between two workers (``workers.lent_memory``): the
lender's keep, bounded and counted, and the reader's checks, against this very process
(which may read its own memory) and one that is gone."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fabric.core.errors import ProtocolError
from fabric.core.shm import boot_id
from fabric.workers.lent_memory import (LEND_SECONDS, MAX_LENT, LendUnreadable, LentMemory,
                                        read_lent)
from fabric.workers.memory import MemoryBudget
from fabric.workers.shared_memory import HostSharing, start_time

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lender(limit: int | None = None) -> tuple[LentMemory, Clock]:
    clock = Clock()
    return LentMemory(MemoryBudget(limit).allowance(), clock), clock


def test_a_lend_is_kept_and_counted_until_its_own_session_releases_it():
    lent, _ = lender()
    array = np.arange(1000.0)
    named = lent.lend(7, 42, array)
    assert named[:4] == [boot_id(), os.getpid(), start_time(os.getpid()), array.ctypes.data]
    assert lent.nbytes == lent.allowance.held == array.nbytes
    lent.release(8, 42)  # another session's release: ignored
    lent.release(7, 43)  # a ticket never lent: ignored
    assert lent.nbytes == array.nbytes
    lent.release(7, 42)
    assert lent.nbytes == lent.allowance.held == 0 and not lent.kept


def test_a_lend_never_released_goes_once_its_time_ran_out():
    lent, clock = lender()
    lent.lend(1, 1, np.ones(10))
    clock.now += LEND_SECONDS - 1
    lent.expire()
    assert lent.nbytes == 80  # (a reader may still read it)
    clock.now += 1
    lent.lend(1, 2, np.ones(5))  # (each lend lets the expired ones go first)
    assert list(lent.kept) == [2] and lent.nbytes == lent.allowance.held == 40


def test_lends_are_bounded_by_count_by_the_workers_budget_and_by_ticket():
    lent, _ = lender(limit=1000)
    assert lent.lend(1, 1, np.ones(100)) is not None  # 800 bytes
    assert lent.lend(1, 2, np.ones(100)) is None  # past the budget: the bytes travel
    assert lent.lend(1, 1, np.ones(1)) is None  # a ticket lent already
    lent, _ = lender()
    for ticket in range(MAX_LENT):
        assert lent.lend(1, ticket, np.ones(1)) is not None
    assert lent.lend(1, MAX_LENT, np.ones(1)) is None


def test_a_reader_fills_its_array_from_the_lending_process():
    lent, clock = lender()
    array = np.random.default_rng(0).random(300_000)
    into = np.empty_like(array)
    read_lent(lent.lend(1, 1, array), into, HostSharing(), clock)
    np.testing.assert_array_equal(into, array)


MALFORMED = "lent is \\[boot, pid, start time"


@pytest.mark.parametrize("case, error", [
    ("malformed", MALFORMED),
    ("negative address", MALFORMED),
    ("another host", "another host"),
    ("running out", "ran out"),
    ("another start time", "is not the worker"),
    ("unmapped", "could not be read"),
    ("gone", "is gone"),
    ("no sharing", "shares no memory"),
])
def test_a_reader_refuses_what_it_must_not_read_with_a_sentence(case, error):
    lent, clock = lender()
    array = np.ones(64)
    named = lent.lend(1, 1, array)
    sharing = HostSharing()
    if case == "malformed":
        named = named[:4]
    elif case == "negative address":
        named[3] = -1
    elif case == "another host":
        named[0] = "another boot"
    elif case == "running out":
        clock.now += LEND_SECONDS - 5
    elif case == "another start time":
        named[2] += 1
    elif case == "unmapped":
        named[3] = 8
    elif case == "gone":
        ended = subprocess.Popen([sys.executable, "-c", "pass"])
        ended.wait(10)
        named[1] = ended.pid
    elif case == "no sharing":
        sharing = HostSharing(enabled=False)
    into = np.zeros(64)
    with pytest.raises(ProtocolError, match=error) as refused:
        read_lent(named, into, sharing, clock)
    assert not into.any()
    # (a lend it cannot read is sent again with its bytes; a malformed one poisons)
    assert isinstance(refused.value, LendUnreadable) is (error != MALFORMED)
