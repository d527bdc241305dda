"""Size checks that never allocate what they check, against real workers under
``--memory-limit`` (issue 41, section 2, findings 5 and 12): an op whose result would pass the
limit is refused with ``QuotaExceeded`` before anything of that size exists, which the
worker's peak resident memory (``VmHWM``) shows; the session and its bystanders go on.

The attacks are scaled to a 64 MiB limit and results of about 320 MB (the issue's were
3.2 GB and 2.4 GB), which the unfixed worker allocated and a 24 GiB machine survives.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fabric
from fabric.core.errors import QuotaExceeded, RemoteError

from conftest import HEARTBEAT

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
LIMIT = 64 * MiB
RESULT = 320_000_000  # bytes each attack's result would take


@pytest.fixture(scope="module")
def limited():
    """A broker and one numpy worker whose sessions may each hold 64 MiB."""
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", str(LIMIT))) as running:
        yield running


def reset_peak(pid: int) -> None:
    """Start a process's peak resident bytes afresh, at what it holds now (Linux 4.0's
    ``clear_refs`` 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


def peak(pid: int) -> int:
    """A process's peak resident bytes since ``reset_peak``."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmHWM:"))


def refused_without_allocating(cluster: fabric.LocalCluster, attack,
                               refused: bool = True) -> QuotaExceeded | None:
    """Run ``attack(session)`` (it reads what it made); the QuotaExceeded it raised (none
    where not ``refused``), after checking the peak memory of the worker, and of this
    process (the client infers the result's shape with the same rules), grew by far less
    than the result, and that the session and a bystander's go on."""
    processes = (cluster.workers[0].pid, os.getpid())
    for pid in processes:
        reset_peak(pid)
    before = [peak(pid) for pid in processes]
    with cluster.connect() as session:
        if refused:
            with pytest.raises(QuotaExceeded) as info:
                attack(session)
        else:
            attack(session)
        assert session.arange(4.0).sum().numpy() == 6.0
    with cluster.connect() as bystander:
        assert bystander.arange(5).sum().numpy() == 10
    for pid, was, who in zip(processes, before, ("worker", "client")):
        grown = peak(pid) - was
        assert grown < 2 * LIMIT, f"the {who}'s peak memory grew by {grown} bytes"
    assert cluster.workers[0].poll() is None
    return info.value if refused else None


def test_an_index_bomb_is_refused_before_its_result_exists(limited):
    # Finding 5: getitem of a (1, 10000) tensor with 4,000 zeros as index (32 KB in, 320 MB
    # out): the size check built the result (on a zero-strided stand-in) to measure it.
    def attack(session: fabric.Session) -> None:
        x = session.asarray(np.zeros((1, 10_000)))
        zeros = session.asarray(np.zeros(RESULT // 80_000, np.int64))
        x[zeros].sum().numpy()  # (a small read: the poison of the getitem comes back)

    error = refused_without_allocating(limited, attack)
    assert "getitem" in error.message and "--memory-limit" in error.message


def test_a_setitem_through_the_same_index_is_checked_without_building_its_region(limited):
    # The same index on the update side: the region it selects was built (320 MB) to check
    # that the value fits it, though the result is the target's 80 KB.
    def attack(session: fabric.Session) -> None:
        x = session.asarray(np.zeros((1, 10_000)))
        zeros = session.asarray(np.zeros(RESULT // 80_000, np.int64))
        x[zeros] = 1.0
        assert x.numpy().sum() == 10_000.0

    refused_without_allocating(limited, attack, refused=False)


@pytest.mark.parametrize("case", ["data", "minlength"])
def test_a_bincount_past_the_limit_is_refused_before_it_allocates(limited, case):
    # Finding 12: bincount's length depends on the data; it was charged after it allocated
    # (2.4 GB resident in a session limited to 256 MiB).
    length = RESULT // 8

    def attack(session: fabric.Session) -> None:
        if case == "data":
            np.bincount(session.asarray(np.array([length - 1, 3])))
        else:
            np.bincount(session.asarray(np.array([1, 3])), minlength=length)

    error = refused_without_allocating(limited, attack)
    assert "bincount" in error.message and f"({RESULT:,} bytes)" in error.message


def test_an_argwhere_past_the_limit_is_refused_before_it_allocates(limited):
    # argwhere's rows depend on the data too: 4M true elements of a 4-d bool (16 MB) make
    # 128 MB of indexes.
    def attack(session: fabric.Session) -> None:
        np.argwhere(session.ones((40, 100, 100, 100), dtype=bool))

    refused_without_allocating(limited, attack)


def test_a_repeat_by_a_tensor_of_counts_past_the_limit_is_refused_before_it_allocates(limited):
    # The array API's repeat with a tensor of repeats: its length is the counts' sum (two
    # counts of 20M each make 320 MB of float64).
    def attack(session: fabric.Session) -> None:
        x = session.asarray(np.array([1.0, 2.0]))
        x.__array_namespace__().repeat(x, session.asarray(np.array([RESULT // 16] * 2)))

    error = refused_without_allocating(limited, attack)
    assert "repeat" in error.message and f"({RESULT:,} bytes)" in error.message


def test_data_dependent_results_within_the_limit_are_as_numpys(limited):
    with limited.connect() as session:
        values = np.array([0, 3, 3, 7, 1])
        assert np.array_equal(np.bincount(session.asarray(values), minlength=10).numpy(),
                              np.bincount(values, minlength=10))
        weights = np.array([0.5, 1.0, 2.0, 0.25, 4.0])
        assert np.array_equal(np.bincount(session.asarray(values),
                                          session.asarray(weights)).numpy(),
                              np.bincount(values, weights))
        assert np.array_equal(np.bincount(session.asarray(np.array([], np.int64))).numpy(),
                              np.bincount(np.array([], np.int64)))
        mask = np.arange(24).reshape(2, 3, 4) % 5 == 0
        assert np.array_equal(np.argwhere(session.asarray(mask)).numpy(), np.argwhere(mask))
        x = np.arange(30.0).reshape(3, 10)
        index = np.array([[2, 0], [1, 1]])
        tx = session.asarray(x)
        assert np.array_equal(tx[session.asarray(index)].numpy(), x[index])
        assert np.array_equal(tx[:, session.asarray(index)].numpy(), x[:, index])
        assert np.array_equal(tx[session.asarray(np.array([0, 2])), 3:7].numpy(),
                              x[np.array([0, 2]), 3:7])
        with pytest.raises(RemoteError, match="IndexError: index 5 is out of bounds"):
            tx[session.asarray(np.array([5]))].numpy()  # (the device checks the values)
