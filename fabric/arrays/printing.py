"""How a tensor prints: numpy's text of its values, read from its device.

Rule: the text is numpy's, under numpy's print options, and printing is a read. A tensor of
more elements than numpy's ``threshold`` is read only as far as numpy's summary shows it: on
each axis longer than twice ``edgeitems``, the first and last ``edgeitems`` and one element
between them, which the summary hides as ``...`` (so printing a billion elements reads a few
dozen). numpy's formatting sees only the elements it shows, so the text is the one it gives
for the whole array; only the ``shape=`` numpy's repr adds to a summary is the tensor's own.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fabric.arrays.html_repr import one_line, table
from fabric.core.errors import FabricError


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


class Printed:
    """How a tensor shows itself: its values as numpy prints them (a read), and its handle
    in a notebook or one line (no read). The class gives ``_handle`` (the handle named in
    errors), ``_fields`` (what the client knows without a read) and ``_shown`` (the values
    printing reads, and whether they are a summary's part)."""

    _handle: Callable[[], str]
    _fields: Callable[[], list[tuple[str, Any]]]
    _shown: Callable[[], tuple[np.ndarray, bool]]
    shape: tuple[int, ...]

    def describe(self) -> str:
        """One line of what the notebook shows (``_repr_html_``): the handle, never the
        values, so no read (``repr`` prints the values, read, as numpy's does)."""
        return one_line(type(self).__name__, self._fields())

    def _repr_html_(self) -> str:
        """The notebook's view: the handle as a table, and no values (values are on the
        client only once read, and a display never reads; ``repr(t)`` shows them)."""
        return table(type(self).__name__, self._fields(), self._picture())

    def _picture(self) -> str:
        return ""  # (a sharded tensor draws its blocks)

    def _printed(self, show: Callable[[np.ndarray, bool], str]) -> str:
        try:
            values, summarised = self._shown()
        except FabricError as exc:  # (a failed op, a closed session, a trace: still shown)
            return f"{self._handle()[:-1]} unreadable: {type(exc).__name__}>"
        return show(values, summarised)

    def __repr__(self) -> str:
        """numpy's repr of the values, as ``tensor(...)``: a read (of what numpy's print
        options show of a large tensor)."""
        return self._printed(lambda values, summarised: repr_text(
            values, self.shape, summarised, self._repr_name))

    _repr_name = "tensor"

    def __str__(self) -> str:
        """numpy's str of the values: a read (of what numpy shows)."""
        return self._printed(lambda values, summarised: summary_text(values, summarised, str))

    def __format__(self, spec: str) -> str:
        """numpy's format of the values (``f"{loss:.4f}"`` on a 0-d tensor): a read."""
        if not spec:
            return str(self)
        return self._printed(lambda values, summarised: summary_text(
            values, summarised, lambda shown: format(shown, spec)))

