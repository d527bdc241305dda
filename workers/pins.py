"""Pins: the device slots a client's reads show it without a copy, kept from reuse while the
arrays read (views, here) live: ``t.numpy()`` maps the slot copy on write, the client's own
array; ``t.numpy(copy=False)`` maps it shared, read-only. Either way the slot must not change
while pinned: a tensor never changes, and its slot is never written in place.

Rule: a tensor that lives in a slot of its device's own pool (an upload or a move written
there: ``workers.shared_memory.uploaded``) is shown to its client as that slot itself: the
worker pins the slot (holds its tensor's memory, so that the slot does not go back to the
pool when the tensor is freed) and names it; the client maps it, and says ``unpin`` once the
view is collected. A pinned slot is never lent again until unpinned. Pins are charged to
their session as a copy of the slot's tensor (``--memory-limit``, ``--memory-budget``) once
per slot, and a session holds at most ``MAX_PINS``; past either, the read copies instead. A
session that ends with slots pinned (its client closed it with views alive, or was killed)
retires them: their segments leave the pool, and their memory goes with the last mapping
(the client's, if it still has views; none, if it was killed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from fabric.core.errors import ProtocolError, QuotaExceeded
from fabric.core.segment_pool import SegmentPool, Slot, SlotMemory
from fabric.core.shm import MAX_PINS

from .device_session import DeviceSession


@dataclass
class Pin:
    """A pinned slot: the memory holder that keeps it lent, and how many views use it."""

    holder: SlotMemory
    views: int


class SessionPins:
    """The slots one session's client views, by segment name."""

    def __init__(self) -> None:
        self.pinned: dict[str, Pin] = {}
        self.views = 0  # views in all (each pin's ``views``)

    def pin(self, executor: Any, session: DeviceSession, array: Any) -> list[Any] | None:
        """Pin the device slot that ``array`` (a tensor's values) lies in, for one more view:
        the slot's part that holds it, ``[segment name, offset, nbytes]`` (``fabric.core.wire``);
        None where it lies in none (a computed tensor), is not C-contiguous, or the pin is
        past the session's bounds (the read then copies)."""
        holder = _memory_of(array)
        if not isinstance(holder, SlotMemory) or holder.lent is None \
                or not array.flags.c_contiguous or self.views >= MAX_PINS:
            return None
        slot: Slot = holder.lent[1]
        name = slot.segment.name
        if name not in self.pinned:
            size = holder.values.nbytes
            try:
                executor._require(session, "an array read without a copy", size, size)
            except QuotaExceeded:
                return None
            executor.allowance.charge(session, size)
            self.pinned[name] = Pin(holder, 0)
        self.pinned[name].views += 1
        self.views += 1
        start = array.__array_interface__["data"][0] - holder.values.__array_interface__[
            "data"][0]
        return [name, slot.offset + start, array.nbytes]

    def unpin(self, executor: Any, session: DeviceSession, names: Any) -> None:
        """One view fewer of each slot in ``names`` (a name once per view); a slot no view
        uses any more is no longer charged, and goes back to its pool once its tensor is
        freed too. ProtocolError, changing nothing, unless each is this session's pin."""
        if type(names) is not list or not names or len(names) > MAX_PINS \
                or any(type(name) is not str for name in names):
            raise ProtocolError(f"An unpin request names 1 to {MAX_PINS} pinned slots, "
                                "as a list of segment names.")
        wanted = Counter(names)
        if any(name not in self.pinned or self.pinned[name].views < count
               for name, count in wanted.items()):
            raise ProtocolError("An unpin may name only slots this session pinned for its "
                                "arrays read without a copy, once per view: "
                                "nothing was unpinned.")
        for name, count in wanted.items():
            pin = self.pinned[name]
            pin.views -= count
            self.views -= count
            if not pin.views:
                del self.pinned[name]
                size = pin.holder.values.nbytes
                executor.allowance.refund(session, size)
        executor.allowance.settle()

    def retire(self) -> None:
        """The session ended: the pinned slots leave their pools (a view may still use them,
        in a client that closed the session but lives), unmapped here once their tensors
        are gone. (Its charges go with the session's.)"""
        for pin in self.pinned.values():
            pool: SegmentPool = pin.holder.lent[0]
            pool.give_back_from_any_thread(pin.holder.lent[1], retire=True)
        self.pinned.clear()
        self.views = 0


def _memory_of(array: Any) -> Any:
    """What holds ``array``'s memory: the first base that is not an array (numpy stops its
    chain of bases at an array over another kind of object, such as ``SlotMemory``)."""
    while type(array) is np.ndarray:
        array = array.base
    return array
