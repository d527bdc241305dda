"""How a tensor prints: numpy's text of its values, read from its device.

Rule: the text is numpy's, under numpy's print options, and printing is a read. A tensor of
more elements than numpy's ``threshold`` is read only as far as numpy's summary shows it: on
each axis longer than twice ``edgeitems``, the first and last ``edgeitems`` and one element
between them, which the summary hides as ``...`` (so printing a billion elements reads a few
dozen). numpy's formatting sees only the elements it shows, so the text is the one it gives
for the whole array; only the ``shape=`` numpy's repr adds to a summary is the tensor's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def summary_index(shape: tuple[int, ...]) -> tuple[np.ndarray, ...] | None:
    """The index (``np.ix_``'s) of what numpy's printing shows of an array of ``shape``, one
    hidden element kept on each summarised axis; None when numpy prints all of it."""
    positions = summary_positions(shape)
    return None if positions is None else np.ix_(*positions)


def summary_positions(shape: tuple[int, ...]) -> list[np.ndarray] | None:
    """Each axis's positions (ascending) that ``summary_index`` keeps; None when numpy
    prints all of the array."""
    options = np.get_printoptions()
    if np.prod(shape) <= options["threshold"]:
        return None
    edge = options["edgeitems"]
    return [np.r_[0:edge + 1, n - edge:n] if n > 2 * edge else np.arange(n) for n in shape]


def summary_text(values: np.ndarray, summarised: bool, show: Any) -> str:
    """``show(values)`` (str, or a format), as numpy gives it for the array ``values`` were
    read from (``summary_index``)."""
    if not summarised:
        return show(values)
    with np.printoptions(threshold=0):  # (values are short: summarised as the whole was)
        return show(values)


def repr_text(values: np.ndarray, shape: tuple[int, ...], summarised: bool,
              name: str) -> str:
    """numpy's repr of an array of ``shape`` that ``values`` were read from, as ``name(...)``
    (``tensor``): numpy's own rule (``array_repr``) with the array's own shape."""
    prefix = name + "("
    options = np.get_printoptions()
    with np.printoptions(threshold=0 if summarised else options["threshold"]):
        text = prefix + np.array2string(values, separator=", ", prefix=prefix, suffix=")")
    extras = []
    if summarised or values.size == 0 and shape != (0,):
        extras.append(f"shape={shape}")
    dtype = _dtype_shown(values.dtype)
    if dtype is not None or values.size == 0:
        extras.append(f"dtype={dtype or values.dtype}")
    if not extras:
        return text + ")"
    text += ","
    more = ", ".join(extras) + ")"
    last_line = len(text) - (text.rfind("\n") + 1)  # (numpy's: extras on a new line only
    spacer = " " if last_line + len(more) + 1 <= options["linewidth"] else "\n" + " " * len(
        prefix)  # where they would pass the line width)
    return text + spacer + more


def _dtype_shown(dtype: np.dtype) -> str | None:
    # How numpy's repr names dtype, where it names it (not for the ones its text implies)
    text = repr(np.zeros(1, dtype))
    return text[text.index("dtype=") + len("dtype="):-1] if "dtype=" in text else None
