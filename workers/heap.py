"""A worker's heap: the memory its devices' arrays free is kept while they work, for the next
arrays, and given back once they all idle.

Rule: a worker's malloc keeps freed memory (``fabric.launch.local.BULK_MALLOC_TUNABLES``), but
glibc trims the top of its heap once 1 GiB or more is free there, so a device whose ops make
and free arrays of 1 GiB faulted each new one in afresh (W6's chain, 2 GiB on 2 devices: its
later runs took 5.7-6.9 s so, 3.2-3.3 s with the memory kept). So from its start a worker's
heap keeps ``KEEP_WHILE_BUSY`` bytes free at its top whenever glibc trims it (``M_TOP_PAD``),
and gives back all its free memory but what the worker faulted in at start (``malloc_trim``)
at a broker heartbeat of a device where no device of the worker has run a batch since its own
heartbeat before (``IdleRule``), once the heap holds ``GIVE_BACK_FROM`` bytes more free than
that, and than it held as it last gave back with no work since. What a busy worker keeps is
bounded by that pad and by its own high-water mark: memory its arrays held a moment before.
An operator's own ``glibc.malloc.top_pad`` stands: such a worker keeps that, and gives
nothing back here.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Mapping

from fabric.core.cross_memory import heap_free
from fabric.core.shm import LIBC

# Bytes kept: an eighth of the host's memory, at most what mallopt takes (a C int): glibc asks
# the kernel for that much more address space each time the heap grows
KEEP_WHILE_BUSY = min((1 << 31) - 1, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8)
GIVE_BACK_FROM = 64 << 20  # free bytes past those kept at rest that an idle worker gives back
_M_TOP_PAD = -2  # mallopt's parameter (malloc.h)
_OPERATORS_PAD = "glibc.malloc.top_pad="
_MALLOPT = getattr(LIBC, "mallopt", None)
_MALLOC_TRIM = getattr(LIBC, "malloc_trim", None)
# (glibc's: another C library lacks these calls, or mallinfo2 to see what is free)
_GLIBC = _MALLOPT is not None and _MALLOC_TRIM is not None and heap_free() is not None
if _GLIBC:
    _MALLOPT.argtypes = (ctypes.c_int, ctypes.c_int)
    _MALLOC_TRIM.argtypes = (ctypes.c_size_t,)


class IdleRule:
    """Whether all of a worker's devices idle: at a device's broker heartbeat, none ran a batch
    since its own heartbeat before (its devices' threads call it under ``Heap``'s lock)."""

    def __init__(self, devices: int) -> None:
        self._ran = [0.0] * devices  # each device's seconds of ops at its last heartbeat
        self._busy = [False] * devices  # whether it ran any between its last two

    def all_idle(self, device: int, ran: float) -> bool:
        """Device ``device`` had a heartbeat, its ops having run ``ran`` seconds in all:
        whether no device of the worker ran a batch between its last two heartbeats."""
        self._busy[device] = ran != self._ran[device]
        self._ran[device] = ran
        return not any(self._busy)


class Heap:
    """The worker's heap (one per worker process): from its start it keeps freed memory while
    the worker's ``devices`` work, and gives it back, but ``kept_at_rest`` bytes, once they
    all idle (``heartbeat``); neither where the operator chose a top pad or the C library
    is not glibc."""

    def __init__(self, devices: int, kept_at_rest: int,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.rule = IdleRule(devices)
        self.kept_at_rest = kept_at_rest
        self.keeps = _GLIBC and _OPERATORS_PAD not in environ.get("GLIBC_TUNABLES", "") \
            and _MALLOPT(_M_TOP_PAD, KEEP_WHILE_BUSY) == 1
        self._left = 0  # free bytes the heap held as it last gave back, idle since (it cannot
        # give back a free chunk's partial pages, and they stay free)
        self._lock = threading.Lock()

    def heartbeat(self, device: int, ran: float) -> None:
        """A broker heartbeat on ``device``'s lane, its ops having run ``ran`` seconds in
        all; on its thread."""
        with self._lock:
            if not self.rule.all_idle(device, ran):
                self._left = 0  # (work may have faulted in again what was given back)
            elif self.keeps and (heap_free() or 0) >= max(self._left, self.kept_at_rest) \
                    + GIVE_BACK_FROM:
                _MALLOC_TRIM(self.kept_at_rest)
                self._left = heap_free() or 0
