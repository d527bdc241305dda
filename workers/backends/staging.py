"""Host buffers that a device's transfers pass through, reused for the device's life: pinned
(page-locked) memory on a GPU, which the GPU copies from and to asynchronously and at the
bus's rate, where a copy of pageable memory is staged by the driver, synchronously.

Rule: a device holds at most ``count`` buffers of ``size`` bytes (allocated when first
needed); an array larger than one is copied a buffer at a time, and a buffer is written again
only once the copy that last used it is done (its wait), so that the host's copy into one
buffer overlaps the device's copy out of the other. Written against callables only (what
allocates a buffer, what starts a copy and returns its wait), so that the chunking is the
same, and tested, with host arrays standing in for a GPU's.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

# A copy started: calling it waits until the copy is done.
Wait = Callable[[], None]


class StagingBuffers:
    """``count`` reused host buffers of ``size`` bytes each, made by ``allocate(size)`` (a
    uint8 array over pinned memory on a GPU)."""

    def __init__(self, allocate: Callable[[int], np.ndarray], size: int, count: int = 2) -> None:
        if size <= 0 or count <= 0:
            raise ValueError("staging needs at least one buffer of at least one byte")
        self.allocate = allocate
        self.size = size
        self.buffers: list[np.ndarray | None] = [None] * count
        self.pending: list[Wait | None] = [None] * count
        self.turn = 0

    def upload(self, source: np.ndarray, write: Callable[[slice, np.ndarray], Wait]) -> None:
        """Copy ``source`` (host bytes, uint8, flat) through the buffers: ``write(part,
        buffer)`` starts the copy of ``buffer`` to the target's bytes ``part`` and returns
        its wait. The last copies may still run on return (their buffers wait for them)."""
        for part, slot, buffer in self._chunks(len(source)):
            buffer[:] = source[part]
            self.pending[slot] = write(part, buffer)

    def download(self, target: np.ndarray, read: Callable[[slice, np.ndarray], Wait]) -> None:
        """Fill ``target`` (host bytes, uint8, flat) through the buffers: ``read(part,
        buffer)`` starts the copy of the source's bytes ``part`` into ``buffer`` and returns
        its wait; each chunk is copied out while the next one's copy runs."""
        previous: tuple[slice, int, np.ndarray] | None = None
        for part, slot, buffer in self._chunks(len(target)):
            self.pending[slot] = read(part, buffer)
            if previous is not None:
                self._copy_out(target, *previous)
            previous = part, slot, buffer
        if previous is not None:
            self._copy_out(target, *previous)

    def held_bytes(self) -> int:
        """The bytes of the buffers allocated so far."""
        return sum(buffer.nbytes for buffer in self.buffers if buffer is not None)

    def _copy_out(self, target: np.ndarray, part: slice, slot: int, buffer: np.ndarray) -> None:
        self._wait(slot)
        target[part] = buffer

    def _wait(self, slot: int) -> None:
        wait, self.pending[slot] = self.pending[slot], None
        if wait is not None:
            wait()

    def _chunks(self, nbytes: int) -> Iterator[tuple[slice, int, Any]]:
        """Each chunk's byte range, its buffer's slot and a view of its length, in order,
        once the copy that last used that buffer is done."""
        for start in range(0, nbytes, self.size):
            stop = min(start + self.size, nbytes)
            slot, self.turn = self.turn, (self.turn + 1) % len(self.buffers)
            self._wait(slot)
            buffer = self.buffers[slot]
            if buffer is None:
                buffer = self.buffers[slot] = self.allocate(self.size)
            yield slice(start, stop), slot, buffer[:stop - start]
