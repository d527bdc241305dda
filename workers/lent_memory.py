"""A tensor moved between two workers of one host by memory (``t.to()``): the sending device
lends the tensor's bytes where they lie (``LentMemory``), and the receiving one reads them
straight out of the sender's process (``read_lent``, ``fabric.core.cross_memory``): one copy
into new memory, where a first move through shared memory faulted a new slot in on the
receiving worker and then again in the sender's mapping of it (1.1 GB/s at 256 MiB).

Rule 1 (lender): a lent array is kept, under its move's ticket, until its client says the
receiver has it (a ``release`` op of the session that lent it) or ``LEND_SECONDS`` passed,
even past its session's close: no reader ever reads memory this process has reused since. Its
bytes count against the worker's ``--memory-budget`` while kept (a lend that does not fit
sends the bytes in the TRANSFER instead), and at most ``MAX_LENT`` are kept at once.

Rule 2 (reader): it reads only a process of this host (its boot id) and of its own user that
is still the one that lent (its start time), with more than ``READ_MARGIN_SECONDS`` of the
lend left; a lend it cannot read so (``LendUnreadable``, with a sentence) is sent again with
its bytes (``workers.session_moves``), and a malformed one is the moved tensor's poison. The
monotonic clock is one for every process of a host, so the lender's deadline means the same
here.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from fabric.core import cross_memory
from fabric.core.errors import ProtocolError
from fabric.core.shm import boot_id

from .memory import Allowance
from .shared_memory import ClientProcess, HostSharing, start_time

LEND_SECONDS = 60.0  # a lent tensor's longest keep, released or not
READ_MARGIN_SECONDS = 10.0  # a reader reads no lend with less than this left
MAX_LENT = 256  # lends a device keeps at once; beyond, a move carries its bytes


class LendUnreadable(ProtocolError):
    """A lend this worker cannot read (no shared memory here, another host, run out, its
    process gone, another's, or refused by the kernel): its move sends the bytes instead."""


class LentMemory:
    """The arrays one device lent by memory: ticket -> (lending session, array, deadline),
    counted in ``allowance.held`` while kept (``nbytes``)."""

    def __init__(self, allowance: Allowance,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowance = allowance
        self.kept: dict[int, tuple[int, np.ndarray, float]] = {}
        self._clock = clock
        self._lender = [boot_id(), os.getpid(), start_time(os.getpid()) or 0]  # (this one)

    @property
    def nbytes(self) -> int:
        """The bytes of every array kept."""
        return sum(array.nbytes for _, array, _ in self.kept.values())

    def lend(self, session: int, ticket: int, array: np.ndarray) -> list[Any] | None:
        """Keep ``array`` (C-contiguous) for the move ``ticket`` of ``session``; what the
        TRANSFER names for its reader (``[boot, pid, start time, address, deadline]``), or
        None where no lend is kept (the bound, the budget, a ticket lent already)."""
        self.expire()
        if len(self.kept) >= MAX_LENT or ticket in self.kept \
                or not self.allowance.fits(array.nbytes):
            return None
        until = self._clock() + LEND_SECONDS
        self.kept[ticket] = (session, array, until)
        self.allowance.held += array.nbytes
        return [*self._lender, array.ctypes.data, until]

    def release(self, session: int, ticket: Any) -> None:
        """The client of ``session`` says the move ``ticket`` was read (or given up): its
        array goes (a ticket of another session's is ignored)."""
        kept = self.kept.get(ticket)
        if kept is not None and kept[0] == session:
            self._drop(ticket)
        self.expire()

    def expire(self) -> None:
        """Drop every lend past its deadline (a client that never said)."""
        now = self._clock()
        for ticket in [t for t, (_, _, until) in self.kept.items() if until <= now]:
            self._drop(ticket)

    def _drop(self, ticket: int) -> None:
        _, array, _ = self.kept.pop(ticket)
        self.allowance.held -= array.nbytes


def read_lent(lent: Any, into: np.ndarray, sharing: HostSharing,
              clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """``into``, filled with the bytes another worker of this host lent (a TRANSFER's
    ``"lent"``: ``LentMemory.lend``'s list), by the copy threads of ``sharing``.
    ProtocolError where the list is malformed; ``LendUnreadable`` where this worker shares no
    memory (``--no-shared-memory``), the lend is about to end, or its process is gone, is
    another user's, or cannot be read."""
    if not sharing.enabled:
        raise LendUnreadable("This worker shares no memory with other processes "
                             "(--no-shared-memory).")
    if type(lent) is not list or len(lent) != 5 or type(lent[0]) is not str \
            or not all(type(n) is int and n >= 0 for n in lent[1:4]) \
            or type(lent[4]) is not float:
        raise ProtocolError("A TRANSFER's lent is [boot, pid, start time, address, "
                            "deadline].")
    boot, pid, started, address, until = lent
    if boot != boot_id():
        raise LendUnreadable("The tensor was lent by a worker of another host.")
    if until - clock() < READ_MARGIN_SECONDS:
        raise LendUnreadable("The moved tensor waited on this device until its sender's lend "
                             "of it ran out.")
    try:
        process = ClientProcess(pid)
    except OSError:
        raise LendUnreadable(f"The worker process {pid} that sent this tensor is gone.") \
            from None
    try:
        if process.key[1] != started or process.uid != os.geteuid():
            raise LendUnreadable(f"Process {pid} is not the worker that sent this tensor.")
        cross_memory.read(pid, address, into, sharing.copies)
        if not process.same():
            raise LendUnreadable(f"The worker process {pid} that sent this tensor ended while "
                                 "it was read.")
    except OSError as exc:
        raise LendUnreadable(f"The moved tensor's {into.nbytes} bytes could not be read from "
                             f"worker process {pid} ({exc.strerror}).") from None
    finally:
        process.close()
    return into
