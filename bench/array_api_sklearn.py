"""scikit-learn's PCA and Ridge (``array_api_dispatch=True``) on a float64 array resident on one
device, and sharded along its rows over all devices of the cluster (a mesh), against
scikit-learn on numpy in the same run (issue 43, "Measured").

    python bench/array_api_sklearn.py                       # (1,000,000 x 64), 3 repeats
    python bench/array_api_sklearn.py --rows 200000 --repeats 1 --workers 2

For each fit: the median wall time of R fits on numpy, on one device and on the mesh (up to
the devices' last op: the fitted attributes stay tensors there), the ratio to numpy (above 1:
faster than numpy), and what the fit waited for, from ``session.stats()`` (on the mesh,
summed over its sessions, one per device): its round trips (the blocking points: reads,
shapes learned from a device, syncs; a mesh's parallel reads count one per device), the
reads among them and the bytes they read; then the largest difference from the fit on
numpy. Ridge runs the 'svd' solver everywhere, the one scikit-learn takes for an array API
namespace (on the mesh: each device's QR, the small R factors combined); numpy's default
solver (cholesky) is timed beside it. PCA's 'auto' solver takes 'covariance_eigh' for such a
tall array (``X.T @ X``: summed across the devices on the mesh). The arrays are uploaded
before anything is timed. The cluster has ``--workers`` workers of one device each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

# (SciPy reads it when first imported, and scikit-learn imports SciPy)
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.timing import seconds  # noqa: E402

# Seconds one request may wait for the device: a fit's SVD of a 512 MB array takes longer on
# a busy 2-core machine than a session's default (10 s).
TIMEOUT = 600.0
COUNTED = ("round_trips", "reads", "bytes_read")

# name: (the fit of X and y, what of the fitted model is compared; PCA's components have
# either sign)
FITS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any], Any]]] = {
    "PCA(n_components=8)": (lambda X, y: PCA(n_components=8).fit(X),
                            lambda model: abs(model.components_)),
    "Ridge(solver='svd')": (lambda X, y: Ridge(alpha=1.0, solver="svd").fit(X, y),
                            lambda model: model.coef_),
}


def counted(sessions: list[Any]) -> dict[str, int]:
    """What ``sessions`` waited for so far, summed (each answers once its device ran the
    ops sent before)."""
    each = [session.stats() for session in sessions]
    return {key: sum(stats[key] for stats in each) for key in COUNTED}


def fits(fit: Callable[[Any, Any], Any], X: Any, y: Any, repeats: int,
         sessions: list[Any] = ()) -> tuple[float, Any, dict[str, int]]:
    """The median seconds of ``repeats`` fits of ``X`` and ``y``, the last model, and what the
    last fit waited for (on the devices of ``sessions``; on numpy, nothing)."""
    times, model, counts = [], None, {}
    for _ in range(repeats):
        before = counted(sessions) if sessions else {}
        start = time.perf_counter()
        with sklearn.config_context(array_api_dispatch=bool(sessions)):
            model = fit(X, y)
        if sessions:
            after = counted(sessions)  # (answered once the devices ran the fit's last op)
            counts = {key: after[key] - before[key] for key in COUNTED}
        times.append(time.perf_counter() - start)
    return statistics.median(times), model, counts


def values(result: Any) -> np.ndarray:
    return result.numpy() if hasattr(result, "numpy") else np.asarray(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="samples of the array")
    parser.add_argument("--cols", type=int, default=64, help="features of the array")
    parser.add_argument("--repeats", type=int, default=3, help="fits per figure")
    parser.add_argument("--workers", type=int, default=4,
                        help="workers (one device each) of the cluster: the mesh's devices")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.rows, args.cols))
    y = X @ rng.standard_normal(args.cols) + 0.1 * rng.standard_normal(args.rows)
    print(f"scikit-learn {sklearn.__version__} on a ({args.rows:,} x {args.cols}) float64 array "
          f"({X.nbytes / 2**20:,.0f} MiB); {os.cpu_count()} cores; median of {args.repeats}")
    with fabric.LocalCluster(workers=args.workers) as cluster, \
            cluster.connect(timeout=TIMEOUT) as session:
        mesh = session.mesh()
        start = time.perf_counter()
        on_one = session.asarray(X), session.asarray(y)
        session.sync()
        uploaded = time.perf_counter()
        on_mesh = mesh.asarray(X, axis=0), mesh.asarray(y, axis=0)
        counted(mesh.sessions)
        print(f"uploads (not timed below): one device {uploaded - start:.2f} s, the mesh of "
              f"{len(mesh.devices)} devices {time.perf_counter() - uploaded:.2f} s")
        print(f"{'fit':22} {'on':8} {'seconds':>8} {'x numpy':>8} {'round trips':>12} "
              f"{'reads':>6} {'bytes read':>11} {'max diff':>9}")
        for name, (fit, compared) in FITS.items():
            on_numpy, expected, _ = fits(fit, X, y, args.repeats)
            print(f"{name:22} {'numpy':8} {on_numpy:8.3f}")
            for where, (X_there, y_there), sessions in (
                    ("device", on_one, [session]), ("mesh", on_mesh, mesh.sessions)):
                took, model, counts = fits(fit, X_there, y_there, args.repeats, sessions)
                difference = np.max(np.abs(values(compared(model)) - compared(expected)))
                print(f"{'':22} {where:8} {took:8.3f} {on_numpy / took:8.2f} "
                      f"{counts['round_trips']:12} {counts['reads']:6} "
                      f"{counts['bytes_read']:11} {difference:9.1e}")
        cholesky = seconds(lambda: Ridge(alpha=1.0).fit(X, y))
        print(f"(numpy's own Ridge solver, cholesky: {cholesky:.3f} s)")


if __name__ == "__main__":
    main()
