"""A peer's segment mapped copy on write (``fabric.core.shm.map_private``,
``PeerSegments.private``): what ``t.numpy()`` of a tensor in its device's slot returns. The
segments here are this process's own, opened as a peer opens them (by ``/proc/<pid>/fd``)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from fabric.core.errors import ProtocolError
from fabric.core.shm import PeerSegments, Segment, boot_id, next_name

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def segment():
    made = Segment.create(next_name(boot_id(), os.getpid()), 4 << 20)
    made.memory[:] = np.arange(made.size, dtype=np.uint64).view(np.uint8)[:made.size]
    yield made
    made.close()


def mappings_of(name: str) -> int:
    """How many mappings of segment ``name`` this process holds."""
    with open("/proc/self/maps") as maps:
        return sum(f"/memfd:{name} " in line for line in maps)


def test_a_private_mapping_reads_the_segment_and_keeps_its_writes_to_itself(segment):
    values = PeerSegments(os.getpid()).private(segment.name, 12_288, 1 << 20)
    np.testing.assert_array_equal(values, segment.memory[12_288:12_288 + (1 << 20)])
    assert values.flags.writeable
    values[:100] = 0  # (written: this process's own pages from now on)
    assert segment.memory[12_288:12_388].any()
    segment.memory[12_288 + 8_192] ^= 0xFF  # (a page not written here still shows the
    assert values[8_192] == segment.memory[12_288 + 8_192]  # segment's: so its device pins
    segment.memory[12_288] ^= 0xFF  # the slot meanwhile; one written, its own)
    assert values[0] == 0


def test_an_offset_within_a_page_and_an_empty_read_are_mapped_too(segment):
    peer = PeerSegments(os.getpid())
    values = peer.private(segment.name, 4_100, 10)
    np.testing.assert_array_equal(values, segment.memory[4_100:4_110])
    assert peer.private(segment.name, 0, 0).size == 0


def test_the_mapping_goes_with_the_last_array_over_it_and_keeps_no_descriptor(segment):
    values = PeerSegments(os.getpid()).private(segment.name, 0, 1 << 20)
    part = values[10:20].view(np.uint16)
    assert mappings_of(segment.name) == 2  # (the owner's, and this one)
    del values
    gc.collect()
    assert mappings_of(segment.name) == 2 and part.size == 5
    descriptors = len(os.listdir("/proc/self/fd"))
    del part
    gc.collect()
    assert mappings_of(segment.name) == 1
    assert len(os.listdir("/proc/self/fd")) == descriptors


@pytest.mark.parametrize("offset, nbytes, said", [
    (0, (4 << 20) + 1, "has no"),  # past its end
    ((4 << 20) - 8, 16, "has no"),
])
def test_bytes_a_segment_does_not_hold_are_refused(segment, offset, nbytes, said):
    with pytest.raises(ProtocolError, match=said):
        PeerSegments(os.getpid()).private(segment.name, offset, nbytes)


def test_a_segment_its_owner_holds_no_more_is_refused(segment):
    name = segment.name
    segment.close()
    with pytest.raises(ProtocolError, match="does not exist"):
        PeerSegments(os.getpid()).private(name, 0, 8)
