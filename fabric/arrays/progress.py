"""Progress of long waits: a large upload or read, a sync, a move or reshard
(``s.asarray(a)``, ``t.numpy()``, ``s.sync()``, ``sharded.reshard()``).

Rule: a bar shows only what has really happened, and only where a person watches: in a
terminal (stderr is one) or a notebook (tqdm's ``auto`` picks the widget there or the text
bar in a terminal), once a wait has lasted ``WAIT_BEFORE_BAR`` (a second); anywhere else
(a script's output piped or logged) nothing changes. ``show_progress(False)``, or
``FABRIC_PROGRESS=0`` in the environment, turns every bar off.

A transfer is one message, and ZeroMQ hands a message over whole, so nothing inside one can
be watched; a large transfer (``MIN_BYTES`` or more) where a bar may show is therefore made of
pieces that each arrive whole: ``CHUNK_BYTES`` of the array's flat (C-order) values at a
time. An upload fills a tensor made on the device (``empty``) a chunk at a time, each written
in place (``t[a:b] = chunk``, no second copy on the device), and counts a chunk's bytes once
the device has stored it (a sync: one round trip per chunk); a read reads a chunk at a time
into one array, and counts a chunk's bytes once they are in. The values are the same as
without progress, in one message or not. Any other wait for a device's answer (a sync, a
move, a read in one message) longer than a second shows how long it has waited: the device
does not say how far it is.

``progress=`` of an upload or read: None (the default) as above, where an upload goes in
chunks and a read in one message (in chunks, a warm 256 MiB read ran at half the speed, an
upload at the same); True draws the bar of bytes from the start (where a person watches);
False never; a callable is called with ``(done_bytes, total_bytes)`` after each chunk, for a
program that shows progress its own way (whatever the size and the terminal).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Iterator, TypeVar, Union

import numpy as np

from fabric.arrays import read_target
from fabric.core.errors import RequestTimeout

MIN_BYTES = 64 << 20  # the smallest transfer for which a bar may show
CHUNK_BYTES = 16 << 20  # the values in each piece of a transfer that shows progress
WAIT_BEFORE_BAR = 1.0  # seconds a wait lasts before its bar shows (where one may)
_TICK = 0.25  # seconds between a waiting bar's redraws

Progress = Union[bool, None, Callable[[int, int], Any]]
Result = TypeVar("Result")

_bars_on = os.environ.get("FABRIC_PROGRESS", "1").strip().lower() not in ("0", "off", "false",
                                                                        "no")


def show_progress(on: bool = True) -> None:
    """Turn progress bars on (the default) or off, for every session of this process."""
    global _bars_on
    _bars_on = bool(on)


def watched() -> bool:
    """Whether a person may watch a bar: stderr is a terminal, or this is a notebook's kernel
    (where tqdm's ``auto`` draws a widget)."""
    if "ipykernel" in sys.modules:
        return True
    return sys.stderr is not None and sys.stderr.isatty()


def wanted(progress: Progress, nbytes: int) -> bool:
    """Whether a transfer of ``nbytes`` goes in chunks to show ``progress``: a callable
    always; None (while bars are on) or True for a large transfer that a person watches."""
    if callable(progress):
        return True
    if progress is False or (progress is None and not _bars_on) or nbytes < MIN_BYTES:
        return False
    return watched()


@contextlib.contextmanager
def _reporter(progress: Progress, total: int, what: str) -> Iterator[Callable[[int], None]]:
    """A function of the bytes done so far that tells ``progress`` (a callable, or a bar)."""
    if callable(progress):
        yield lambda done: progress(done, total)
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=what, unit="B", unit_scale=True, unit_divisor=1024,
              leave=False, delay=0 if progress else WAIT_BEFORE_BAR) as bar:
        yield lambda done: bar.update(done - bar.n)


def wait_showing(wait: Callable[[float, bool], Result], remaining: float,
                 what: Callable[[], str]) -> Result:
    """``wait(seconds, keep)``'s result, waited for up to ``remaining`` more seconds by a wait
    that has lasted ``WAIT_BEFORE_BAR`` already: a bar of the time waited, named ``what()``,
    shows where a person watches. ``wait`` raises RequestTimeout when its ``seconds`` pass,
    keeping what it waits for where ``keep`` (so that it may be waited for again)."""
    if not (_bars_on and watched()):
        return wait(remaining, False)
    from tqdm.auto import tqdm

    deadline = time.monotonic() + remaining
    with tqdm(desc=what(), bar_format="{desc}: waited {elapsed}", leave=False) as bar:
        bar.start_t -= WAIT_BEFORE_BAR  # (the second waited before it showed)
        while True:
            remaining = deadline - time.monotonic()
            try:
                return wait(min(_TICK, remaining), remaining > _TICK)
            except RequestTimeout:
                if remaining <= _TICK:
                    raise
            bar.refresh()


def _chunks(size: int, itemsize: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of each chunk of ``size`` flat elements of ``itemsize`` bytes."""
    step = max(1, CHUNK_BYTES // max(itemsize, 1))
    for start in range(0, size, step):
        yield start, min(start + step, size)


def upload(session: Any, array: np.ndarray, progress: Progress) -> Any:
    """``array`` uploaded to ``session``'s device a chunk at a time (see the module's rule);
    the tensor, of ``array``'s shape and dtype."""
    flat = np.ascontiguousarray(array).reshape(-1)
    tensor = session.empty(flat.shape, flat.dtype)
    with _reporter(progress, array.nbytes, f"upload to device {session.device.index}") as done:
        done(0)
        for start, stop in _chunks(flat.size, flat.itemsize):
            tensor[start:stop] = flat[start:stop]
            session.sync()  # the chunk is stored: it counts
            done(stop * flat.itemsize)
    return tensor.reshape(array.shape)


def read_showing(tensor: Any, progress: Progress, out: np.ndarray | None = None) \
        -> np.ndarray:
    """``tensor``'s values read a chunk at a time, where ``progress`` is ``wanted`` (see the
    module's rule), the next chunk's read sent before the last one's values are waited for;
    into ``out`` where given (checked: ``fabric.arrays.read_target``), each chunk written
    straight there where it can be (new memory is not: it faults in slower so than under a
    copy)."""
    session = tensor.session
    in_place = out is not None and read_target.direct(tensor, out)
    into = out.reshape(-1) if in_place else np.empty(tensor.size, tensor.dtype)
    flat = tensor.reshape(-1)
    chunks = list(_chunks(tensor.size, into.itemsize))

    def start(chunk: tuple[int, int]) -> Any:
        return session.start_read(flat[slice(*chunk)],
                                  out=into[slice(*chunk)] if in_place else None)

    with _reporter(progress, into.nbytes, f"read from device {session.device.index}") as done:
        done(0)
        pending = start(chunks[0]) if chunks else None
        for index, (begin, stop) in enumerate(chunks):
            current = pending
            if index + 1 < len(chunks):
                pending = start(chunks[index + 1])
            read_target.fill(into[begin:stop], current.result())
            done(stop * into.itemsize)
    if in_place:
        return out
    values = into.reshape(tensor.shape)
    return values if out is None else read_target.fill(out, values)
