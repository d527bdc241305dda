"""One session's state on a worker's device (what ``workers.executor`` keeps per session)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fabric.core.protocol import Message
from fabric.core.resume import ReplyRecord
from fabric.core.wire import DeviceWarning

from .backends.base import DEVICE_COUNTERS, Value
from .registered_graphs import SessionGraphs


@dataclass(slots=True)  # (slots: its fields are read several times per op)
class DeviceSession:
    """One session's state on its device: its tensors, poison, credit, graphs, counters."""

    id: int
    client: str
    reply_limit: int | None = None  # the largest message its client takes, if it said
    tensors: dict[int, Value] = field(default_factory=dict)
    poisoned: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> wire error
    unreported: list[dict[str, Any]] = field(default_factory=list)  # for the next sync
    resident: int = 0  # bytes held in ``tensors``
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    ops: int = 0
    submits: int = 0  # SUBMITs run: the client's credit (fabric.core.flow.SUBMIT_WINDOW)
    outgoing: list[Message] = field(default_factory=list)  # TRANSFERs made by "send" ops
    awaiting: dict[int, list[Message]] = field(default_factory=dict)  # id -> "await" requests
    # Tensors this session consented to receive (``expect``): one-time ticket -> new tensor id.
    expected: dict[int, int] = field(default_factory=dict)
    # TRANSFERs that came before their ticket (``workers.session_moves``): ticket -> (the
    # TRANSFER, when it stops waiting), and the tickets of those dropped; the tickets used,
    # the newest, in order; and the tensors whose TRANSFER must come again, and why
    early: dict[int, tuple[Message, float]] = field(default_factory=dict)
    early_dropped: dict[int, None] = field(default_factory=dict)
    used_tickets: dict[int, None] = field(default_factory=dict)
    again: dict[int, str] = field(default_factory=dict)
    transfers_refused: int = 0  # TRANSFERs without a ticket it gave: dropped
    # numpy's warnings since the last REPLY (distinct ones, in order), and how many more
    warnings: dict[DeviceWarning, None] = field(default_factory=dict)
    warnings_dropped: int = 0
    graphs: SessionGraphs = field(default_factory=SessionGraphs)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DEVICE_COUNTERS, 0))
    segments: Any = None  # its client's shared memory, once agreed (``shared_memory``)
    slots_used: bool = False  # a put of this batch read a slot: CREDIT it at once
    # Resuming it on another broker of a pair (``fabric.core.resume``): whose it is (the
    # digest of its client token), its secret's digest, and its recent replies by request id.
    owner: bytes = b""
    secret_digest: bytes = b""
    replies: ReplyRecord = field(default_factory=ReplyRecord)
