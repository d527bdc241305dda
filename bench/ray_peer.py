"""Ray's W3 on this machine, for a bench to print beside fabric's in the same run: the peer
table of issue 25 came from another day, when a warm memcpy here ran at 13 GB/s.

    python bench/ray_peer.py        # alone: Ray's figures and a warm memcpy's, GB/s

Ray is not among fabric's dependencies (``pip install -e '.[bench]'`` brings it);
``installed()`` says whether it can be imported, ``RayPeer`` times it. "up" is ``ray.put`` of
the array (into the local object store), "down" ``ray.get`` of it copied into a warm buffer
(the array Ray returns is a read-only view of the store, as ``t.numpy(copy=False)`` is: "down
view" is that get alone), "actor push" the array passed to an actor's method, which answers
with its size.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.raw import BULK_BYTES  # noqa: E402
from bench.timing import seconds  # noqa: E402


def installed() -> bool:
    """Whether Ray can be imported here."""
    return importlib.util.find_spec("ray") is not None


def _rate(nbytes: int, run: Callable[[], Any]) -> float:
    return nbytes / seconds(run) / 1e9


class RayPeer:
    """A local Ray (2 CPUs) holding a copy of ``array``, for a bench loop to time Ray's
    transfers of it (``once``) between its own; a context manager (Ray shut down at exit)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __enter__(self) -> "RayPeer":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

        @ray.remote
        class Holder:
            def size(self, values: np.ndarray) -> int:
                return values.nbytes

        self.ray, self.warm = ray, np.ones_like(self.array)
        self.holder = Holder.remote()  # type: ignore[attr-defined]
        ray.get(self.holder.size.remote(self.array))  # (the actor started, the path warm)
        self.kept = ray.put(self.array)
        return self

    def __exit__(self, *exc: object) -> None:
        self.ray.shutdown()

    def once(self) -> dict[str, float]:
        """GB/s of one each of Ray's up, down, down view and actor push."""
        ray, array = self.ray, self.array
        return {name: _rate(array.nbytes, run) for name, run in (
            ("up", lambda: ray.put(array)),
            ("down", lambda: np.copyto(self.warm, ray.get(self.kept))),
            ("down view", lambda: ray.get(self.kept)),
            ("actor push", lambda: ray.get(self.holder.size.remote(array))))}


def main() -> None:
    if not installed():
        sys.exit("bench/ray_peer.py: Ray is not installed (pip install -e '.[bench]')")
    array = np.random.default_rng(0).random(BULK_BYTES // 8)
    warm = np.ones_like(array)
    copy = statistics.median(_rate(array.nbytes, lambda: np.copyto(warm, array))
                             for _ in range(5))
    with RayPeer(array) as peer:
        runs = [peer.once() for _ in range(5)]
    figures = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    print(f"Ray, 256 MiB float64, medians of 5, GB/s (warm memcpy {copy:.2f}): "
          + ", ".join(f"{name} {value:.2f}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
