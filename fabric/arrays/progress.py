"""Progress of a large upload or read (``s.asarray(a, progress=True)``,
``t.numpy(progress=True)``).

Rule: progress counts only what has really arrived. A transfer is one message, and ZeroMQ
hands a message over whole, so nothing inside one can be watched; a transfer that shows
progress is therefore made of pieces that each arrive whole: ``CHUNK_BYTES`` of the array's
flat (C-order) values at a time. An upload fills a tensor made on the device (``empty``) a
chunk at a time, each written in place (``t[a:b] = chunk``, no second copy on the device),
and counts a chunk's bytes once the device has stored it (a sync: one round trip per
chunk); a read reads a chunk at a time into one array, and counts a chunk's bytes once
they are in. The values are the same as without progress, in one message or not.

``progress=True`` draws a rich progress bar on stderr, only in an interactive terminal and
only for a transfer of at least ``MIN_BYTES``; anywhere else (a script's output piped or
logged, a small array) it changes nothing. ``progress=callable`` is called with
``(done_bytes, total_bytes)`` after each chunk, for a program that shows progress its own
way (whatever the size and the terminal). The default, ``False``, never shows anything.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Union

import numpy as np

MIN_BYTES = 64 << 20  # the smallest transfer for which progress=True draws a bar
CHUNK_BYTES = 16 << 20  # the values in each piece of a transfer that shows progress

Progress = Union[bool, Callable[[int, int], Any]]


def wanted(progress: Progress, nbytes: int) -> bool:
    """Whether a transfer of ``nbytes`` goes in chunks to show ``progress``: a callable
    always; True for a large transfer in an interactive terminal."""
    if callable(progress):
        return True
    if progress is not True or nbytes < MIN_BYTES:
        return False
    from rich.console import Console

    return Console(stderr=True).is_terminal


@contextlib.contextmanager
def _reporter(progress: Progress, total: int, what: str) -> Iterator[Callable[[int], None]]:
    """A function of the bytes done so far that tells ``progress`` (a callable, or a bar)."""
    if callable(progress):
        yield lambda done: progress(done, total)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress as Bar, TextColumn,
                               TimeRemainingColumn, TransferSpeedColumn)

    with Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
             TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
             transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done: bar.update(task, completed=done)


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


def read_showing(tensor: Any, progress: Progress) -> np.ndarray:
    """``tensor``'s values; where ``progress`` is ``wanted``, read a chunk at a time (see the
    module's rule), the next chunk's read sent before the last one's values are waited for."""
    session = tensor.session
    if not wanted(progress, tensor.nbytes):
        return session.read(tensor)
    out = np.empty(tensor.size, tensor.dtype)
    flat = tensor.reshape(-1)
    chunks = list(_chunks(tensor.size, out.itemsize))
    with _reporter(progress, out.nbytes, f"read from device {session.device.index}") as done:
        done(0)
        pending = session.start_read(flat[slice(*chunks[0])]) if chunks else None
        for index, (start, stop) in enumerate(chunks):
            current = pending
            if index + 1 < len(chunks):
                pending = session.start_read(flat[slice(*chunks[index + 1])])
            out[start:stop] = current.result()
            done(stop * out.itemsize)
    return out.reshape(tensor.shape)
