"""scikit-learn's PCA and Ridge (``array_api_dispatch=True``) on a float64 array resident on one
device, against scikit-learn on numpy in the same run (issue 43, "Measured").

    python bench/array_api_sklearn.py                       # (1,000,000 x 64), 3 repeats
    python bench/array_api_sklearn.py --rows 200000 --repeats 1

For each fit: the median wall time of R fits on numpy and on the device (up to the device's
last op: the fitted attributes stay tensors there), the ratio (above 1: the device is
faster), and what the fit on the device waited for, from ``session.stats()``: its round trips
(the blocking points: reads, shapes learned from the device, syncs), the reads among them and
the bytes they read; then the largest difference between the two fits' results. Ridge runs
the 'svd' solver on both sides, the one scikit-learn takes for an array API namespace; numpy's
default solver (cholesky) is timed beside it. The array is uploaded before anything is timed.
A mesh (sharded) variant needs fabric's sharded tensors to speak the namespace; the bench
asks one, and says why it is not measured.
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


def fits(fit: Callable[[Any, Any], Any], X: Any, y: Any, repeats: int,
         session: Any = None) -> tuple[float, Any, dict[str, int]]:
    """The median seconds of ``repeats`` fits of ``X`` and ``y``, the last model, and what the
    last fit waited for (on the device of ``session``; on numpy, nothing)."""
    times, model, counts = [], None, {}
    for _ in range(repeats):
        before = session.stats() if session is not None else {}
        start = time.perf_counter()
        with sklearn.config_context(array_api_dispatch=session is not None):
            model = fit(X, y)
        if session is not None:
            after = session.stats()  # (answered once the device ran the fit's last op)
            counts = {key: after[key] - before[key] for key in COUNTED}
        times.append(time.perf_counter() - start)
    return statistics.median(times), model, counts


def sharded_refusal(session: Any) -> str | None:
    """Why a sharded tensor of ``session``'s mesh gives no array API namespace (None where
    it gives one)."""
    sharded = session.mesh().asarray(np.zeros((2, 2)), axis=0)
    try:
        sharded.__array_namespace__()
    except TypeError as refused:
        return f"TypeError({str(refused)!r})"
    return None


def values(result: Any) -> np.ndarray:
    return result.numpy() if hasattr(result, "numpy") else np.asarray(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="samples of the array")
    parser.add_argument("--cols", type=int, default=64, help="features of the array")
    parser.add_argument("--repeats", type=int, default=3, help="fits per figure")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.rows, args.cols))
    y = X @ rng.standard_normal(args.cols) + 0.1 * rng.standard_normal(args.rows)
    print(f"scikit-learn {sklearn.__version__} on a ({args.rows:,} x {args.cols}) float64 array "
          f"({X.nbytes / 2**20:,.0f} MiB); {os.cpu_count()} cores; median of {args.repeats}")
    with fabric.LocalCluster(workers=1) as cluster, \
            cluster.connect(timeout=TIMEOUT) as session:
        start = time.perf_counter()
        X_device, y_device = session.asarray(X), session.asarray(y)
        session.sync()
        print(f"upload to the device (not timed below): {time.perf_counter() - start:.2f} s")
        print(f"{'fit':22} {'numpy s':>9} {'device s':>9} {'x numpy':>8} {'round trips':>12} "
              f"{'reads':>6} {'bytes read':>11} {'max diff':>9}")
        for name, (fit, compared) in FITS.items():
            on_numpy, expected, _ = fits(fit, X, y, args.repeats)
            on_device, model, counts = fits(fit, X_device, y_device, args.repeats, session)
            difference = np.max(np.abs(values(compared(model)) - compared(expected)))
            print(f"{name:22} {on_numpy:9.3f} {on_device:9.3f} {on_numpy / on_device:8.2f} "
                  f"{counts['round_trips']:12} {counts['reads']:6} {counts['bytes_read']:11} "
                  f"{difference:9.1e}")
        cholesky = seconds(lambda: Ridge(alpha=1.0).fit(X, y))
        print(f"(numpy's own Ridge solver, cholesky: {cholesky:.3f} s)")
        refusal = sharded_refusal(session)
    if refusal is not None:
        print(f"mesh (sharded over the devices): not measured: scikit-learn cannot take a "
              f"sharded tensor, whose __array_namespace__() raises {refusal}")
    else:
        print("mesh (sharded): sharded tensors take the namespace now; this bench has no "
              "mesh variant yet")


if __name__ == "__main__":
    main()
