"""Ray's W3 on this machine, for a bench to print beside fabric's in the same run: the peer
table of issue 25 came from another day, when a warm memcpy here ran at 13 GB/s.

    python bench/ray_peer.py        # alone: Ray's figures and a warm memcpy's, GB/s

Ray is not among fabric's dependencies (``pip install ray`` to compare); ``installed()``
says whether it can be imported. "up" is ``ray.put`` of the array (into the local object
store), "down" ``ray.get`` of it copied into a warm buffer (the array Ray returns is a
read-only view of the store, as ``t.numpy(copy=False)`` is: "down view" is that get alone),
"actor push" the array passed to an actor's method, which answers with its size.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.raw import BULK_BYTES  # noqa: E402


def installed() -> bool:
    """Whether Ray can be imported here."""
    return importlib.util.find_spec("ray") is not None


def _rate(nbytes: int, run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return nbytes / (time.perf_counter() - start) / 1e9


def ray_w3(array: np.ndarray, runs: int) -> dict[str, float]:
    """Median GB/s over ``runs`` of Ray's up, down, down view and actor push of ``array``
    (a local Ray with 2 CPUs, started here and shut down before returning)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        warm = np.ones_like(array)

        @ray.remote
        class Holder:
            def size(self, values: np.ndarray) -> int:
                return values.nbytes

        holder = Holder.remote()  # type: ignore[attr-defined]
        ray.get(holder.size.remote(array))  # (the actor started, the path warm)
        kept = ray.put(array)
        figures: dict[str, list[float]] = {}
        for _ in range(runs):
            for name, run in (("up", lambda: ray.put(array)),
                              ("down", lambda: np.copyto(warm, ray.get(kept))),
                              ("down view", lambda: ray.get(kept)),
                              ("actor push", lambda: ray.get(holder.size.remote(array)))):
                figures.setdefault(name, []).append(_rate(array.nbytes, run))
        return {name: statistics.median(values) for name, values in figures.items()}
    finally:
        ray.shutdown()


def main() -> None:
    if not installed():
        sys.exit("bench/ray_peer.py: Ray is not installed (pip install ray)")
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    warm = np.ones_like(array)
    copy = statistics.median(_rate(array.nbytes, lambda: np.copyto(warm, array))
                             for _ in range(5))
    figures = ray_w3(array, 5)
    print(f"Ray, 256 MiB float64, medians of 5, GB/s (warm memcpy {copy:.2f}): "
          + ", ".join(f"{name} {value:.2f}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
