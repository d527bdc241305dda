"""Benchmark W5: 50-op elementwise steps called 1,000 times on 1,000-element tensors.

    python bench/w5_graphs.py            # medians of 5 runs, numpy and numexpr devices
    python bench/w5_graphs.py --steps cheap --large-calls 10

Two steps: ``tanh`` (ten rounds of x = tanh(x*b + c)*0.5 + x) and ``cheap`` (25 rounds of
x = x*b + c: 50 multiply/add ops, issue 29's per-op cost). Three ways to run each, measured in
the same run: replayed as a registered graph (``fabric.function``), streamed op by op (the
same function, not traced), and local numpy eager on the same arrays. Each way feeds a call's
result to the next call and ends with one read of the result. Targets: replay at least 5x
faster than plain streaming (issue 4); on the cheap step the numexpr device's replay at most
1.3x local numpy (issue 29).

Then the cheap step's replay with 1M-element tensors (``--large-calls`` chained calls, one
read) on every device (numpy, numexpr, and jax where it is installed), against local numpy
on the same arrays, in the same run (issue 29: numexpr at least 2x faster than local numpy,
its numexpr using both cores where local numpy uses one; issue 42: the jax device, one XLA
executable per graph, at least 8x local numpy and 2x the numexpr device). Each device's first
call (trace, registration and, on jax, XLA's compile) is timed apart from its replays.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.workers.backends import BACKENDS  # noqa: E402

CALLS = 1_000
ELEMENTS = 1_000
LARGE_ELEMENTS = 1_000_000


def tanh_step(x: Any, b: Any, c: Any) -> Any:
    """The 50-op tanh step: ten rounds of x = tanh(x*b + c)*0.5 + x."""
    for _ in range(10):
        x = np.tanh(x * b + c) * 0.5 + x
    return x


def cheap_step(x: Any, b: Any, c: Any) -> Any:
    """The 50-op cheap step: 25 rounds of x = x*b + c (|b| < 0.5 keeps x bounded)."""
    for _ in range(25):
        x = x * b + c
    return x


STEPS: dict[str, Callable[[Any, Any, Any], Any]] = {"tanh": tanh_step, "cheap": cheap_step}


def run(call: Callable[[Any, Any, Any], Any], x: Any, b: Any, c: Any, calls: int,
        read: Callable[[Any], np.ndarray]) -> tuple[float, np.ndarray]:
    """Seconds for ``calls`` chained calls and the final read; and the result."""
    start = time.perf_counter()
    for _ in range(calls):
        x = call(x, b, c)
    result = read(x)
    return time.perf_counter() - start, result


Way = tuple[Callable[..., Any], list[Any], Callable[[Any], np.ndarray]]  # call, args, read


def ways_on(session: fabric.Session, step: Callable[..., Any], arrays: list[np.ndarray],
            streaming: bool = True, first_calls: dict[str, float] | None = None
            ) -> dict[str, Way]:
    """Graph replay (traced and registered here, outside the timing) and op streaming of
    ``step`` on ``session``'s device, on ``arrays`` uploaded there. The first call's seconds
    (its trace, registration and compile, one run and a read) go into ``first_calls``, and a
    compiling device's compile seconds (``stats()``) under its backend's name + " compile"."""
    tensors = [session.asarray(a) for a in arrays]
    session.sync()
    replayed = fabric.function(step)
    compiled = session.stats().get("device_compile_seconds", 0.0)
    started = time.perf_counter()
    replayed(*tensors).numpy()
    if first_calls is not None:
        backend = session.device.backend
        first_calls[backend] = time.perf_counter() - started
        first_calls[f"{backend} compile"] = session.stats().get(
            "device_compile_seconds", 0.0) - compiled
    ways = {"replay": (replayed, tensors, lambda t: t.numpy())}
    if streaming:
        ways["streaming"] = (step, tensors, lambda t: t.numpy())
    return ways


def medians(ways: dict[str, Way], calls: int, runs: int) -> dict[str, float]:
    """Median seconds of each way, the ways interleaved run by run (so that other load on the
    machine hits them alike); every result must be the first way's."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        expected = None
        for name, (call, args, read) in ways.items():
            seconds, result = run(call, *args, calls=calls, read=read)
            if expected is None:
                expected = result
            np.testing.assert_allclose(result, expected, rtol=1e-9)
            times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are shown")
    parser.add_argument("--steps", nargs="+", choices=sorted(STEPS), default=list(STEPS),
                        help="which steps to measure on 1,000 elements")
    parser.add_argument("--large-calls", type=int, default=10,
                        help="chained calls of the cheap step on 1M elements (0: skip)")
    parser.add_argument("--backends", nargs="+", choices=sorted(BACKENDS),
                        help="the devices to measure (default: numpy, numexpr, and jax where "
                             "it is installed; cupy needs a GPU)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    backends = args.backends or [b for b in ("numpy", "numexpr", "jax") if b != "jax"
                                 or importlib.util.find_spec("jax") is not None]

    def arrays_of(elements: int) -> list[np.ndarray]:
        return [rng.random(elements), rng.random(elements) * 0.5, rng.random(elements) - 0.5]

    arrays, large = arrays_of(ELEMENTS), arrays_of(LARGE_ELEMENTS)
    with contextlib.ExitStack() as stack:
        sessions = {}
        for backend in backends:
            cluster = stack.enter_context(fabric.LocalCluster(workers=1, backend=backend))
            sessions[backend] = stack.enter_context(cluster.connect(timeout=60))
        for name in args.steps:
            step = STEPS[name]
            ways: dict[str, Way] = {"local": (step, arrays, np.asarray)}
            for backend, session in sessions.items():
                ways.update({f"{backend} {way}": value
                             for way, value in ways_on(session, step, arrays).items()})
            times = medians(ways, CALLS, args.runs)
            local = times["local"]
            print(f"W5 {name}: 50-op elementwise step x {CALLS:,} calls on {ELEMENTS:,}-element "
                  f"float64 tensors, medians of {args.runs} interleaved runs (ms per "
                  f"{CALLS:,} calls)")
            rows = [("device", "local numpy", "replay", "streaming", "replay vs streaming",
                     "replay vs local")]
            for backend in sessions:
                replay, streaming = times[f"{backend} replay"], times[f"{backend} streaming"]
                rows.append((backend, f"{local * 1e3:.1f}", f"{replay * 1e3:.1f}",
                             f"{streaming * 1e3:.1f}", f"{streaming / replay:.1f}x faster",
                             f"{replay / local:.2f}x local"))
            print_table(rows)
            print()
        if args.large_calls:
            first_calls: dict[str, float] = {}
            ways = {"local": (cheap_step, large, np.asarray)}
            for backend, session in sessions.items():
                ways[backend] = ways_on(session, cheap_step, large, streaming=False,
                                        first_calls=first_calls)["replay"]
            times = medians(ways, args.large_calls, args.runs)
            local = times["local"]
            print(f"W5 cheap on {LARGE_ELEMENTS:,} elements, {args.large_calls} chained calls, "
                  f"medians of {args.runs} interleaved runs: local numpy {local * 1e3:.0f} ms")
            rows = [("device", "replay", "vs local numpy", "vs numexpr device", "first call",
                     "its compile")]
            for backend in sessions:
                replay = times[backend]
                versus = times.get("numexpr")
                rows.append((backend, f"{replay * 1e3:.0f} ms", f"{local / replay:.2f}x faster",
                             f"{versus / replay:.2f}x faster" if versus else "-",
                             f"{first_calls[backend] * 1e3:.0f} ms",
                             f"{first_calls[backend + ' compile'] * 1e3:.0f} ms"))
            print_table(rows)

if __name__ == "__main__":
    main()
