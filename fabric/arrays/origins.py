"""Origins: where in the user's code each op was issued, for the errors that name it.

Rule: finding an origin costs a frame object or two on every op, and nothing more; the line
number is looked up only when an error names it. Every frame inside this package is fabric's
own, so the origin is the first frame outside it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fabric/
Origin = tuple[Any, int]  # where the user issued an op: (code object or None, byte offset)

# The origin found last, given again for an op from the same call site (a loop issuing ops);
# the elementwise operators test it inline (``fabric.arrays.operators``).
LAST_ORIGIN: list[Origin] = [(None, 0)]


def issued_at(depth: int = 2) -> Origin:
    """Where the user issued the op: the first frame outside fabric, as its code and the
    offset of the instruction that called into fabric.

    ``depth``: how far up to start looking, when the caller knows that the frames below are
    fabric's own. Each frame looked at costs a frame object, on every op. The line number is
    looked up only when an error names it (``origin_line``): ``frame.f_lineno`` scans the
    code's line table, which takes microseconds in a long function or script.

    The origin found last is kept and given again for an op from the same call site (a loop
    issuing ops): that skips the file test and a tuple per op, about a tenth of the client's
    work per op.
    """
    while True:
        try:
            frame = sys._getframe(depth)
        except ValueError:  # fabric all the way down (its own demo, say)
            return (None, 0)
        code, offset = frame.f_code, frame.f_lasti
        last = LAST_ORIGIN[0]
        if code is last[0] and offset == last[1]:
            return last
        if not code.co_filename.startswith(PACKAGE_DIR):
            LAST_ORIGIN[0] = last = (code, offset)
            return last
        depth += 1


def origin_line(origin: Origin) -> tuple[str, int]:
    """The file and line number of an ``Origin``."""
    code, offset = origin
    if code is None:
        return ("?", 0)
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return (code.co_filename, line)
    return (code.co_filename, code.co_firstlineno)
