"""A peer's segment mapped for a transfer (``PeerSegments.map``): its pages, which the owner
allocated, are mapped in for reading (``fabric.core.shm.map_in``), and must then take the
transfer's writes without a page fault, into the owner's pages (shared, never a copy). The
segments here are this process's own, opened as a peer opens them (by ``/proc/<pid>/fd``)."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest

from fabric.core.shm import PeerSegments, Segment, boot_id, next_name

pytestmark = pytest.mark.timeout(30)

NBYTES = 4 << 20  # 1,024 pages of 4 KiB


@pytest.fixture
def segment():
    made = Segment.create(next_name(boot_id(), os.getpid()), 2 * NBYTES)
    made.allocate()
    yield made
    made.close()


def faults_writing(values: np.ndarray) -> int:
    """The page faults this thread took to write every byte of ``values``."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    values[:] = 7
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_a_first_transfer_writes_into_the_owners_pages_without_faulting(segment):
    peer = PeerSegments(os.getpid())
    mapped = peer.map(segment.name, NBYTES, NBYTES)  # (its second half)
    assert faults_writing(mapped.memory[NBYTES:]) < 16
    assert (segment.memory[NBYTES:] == 7).all() and not segment.memory[:NBYTES].any()


def test_pages_not_mapped_in_fault_as_they_are_written(segment):
    # The measure above is one: a mapping made without mapping its pages in faults on each.
    mapped = PeerSegments(os.getpid()).map(segment.name, 0, NBYTES, populate=False)
    assert faults_writing(mapped.memory[:NBYTES]) >= NBYTES // 4096 // 2
    assert (segment.memory[:NBYTES] == 7).all()
