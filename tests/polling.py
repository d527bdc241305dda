"""Waiting in tests: the one polling loop, with a deadline, that says what it awaited.

A test that waits for something another process or thread does (a worker to register, a file
to appear, a count to move) polls for it with ``wait_for``: never a bare ``while`` loop, never
without a deadline. A condition may itself assert (that the process it waits on still runs)
to fail before the deadline. ``poll`` is the same loop for a caller that does not fail at the
deadline (a clean-up that escalates, a harness that raises its own error with its logs).
Receiving from a socket by a deadline is the socket's own poll (``rawpeers``), not this.
"""

from __future__ import annotations

import time
from typing import Any, Callable

INTERVAL = 0.05  # seconds between two looks


def poll(condition: Callable[[], Any], timeout: float, interval: float = INTERVAL) -> Any:
    """Call ``condition`` until it returns something truthy (returned) or ``timeout`` seconds
    have passed (its last, falsy, value returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, *,
             interval: float = INTERVAL, detail: Callable[[], Any] | None = None) -> Any:
    """``condition``'s first truthy value, polled for at most ``timeout`` seconds; at the
    deadline an AssertionError saying what was awaited (``what``, and ``detail()``'s text
    where given: a log's tail, the last rows seen)."""
    value = poll(condition, timeout, interval)
    if not value:
        more = f": {detail()}" if detail is not None else ""
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{more}")
    return value
