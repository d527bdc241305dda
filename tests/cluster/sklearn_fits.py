"""scikit-learn's estimators and metrics (``array_api_dispatch=True``, SciPy's array API flag)
fitted on fabric tensors in a child process, each compared with the same on numpy arrays.

The tests of one device (``test_array_api_sklearn``) and of a mesh (``test_array_api_sharded``)
run this file as a program, ``python sklearn_fits.py BACKEND WHERE CASE...``: SciPy reads
``SCIPY_ARRAY_API`` when it is first imported, which another test may have done in pytest's
process. It starts a real cluster (one worker of one device, or two devices split along X's
rows for ``mesh``) and prints, for each case as JSON: the largest difference from numpy, the
kind of result, and what the fit read back from the devices (``reads``, ``bytes_read``,
summed over the sessions the tensors live on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

# Rows and columns of X: (4000 x 8) float64 is 256,000 bytes, the figure the tests' bounds on
# the bytes read are measured against.
ROWS, COLUMNS = 4000, 8
WHERE = ("device", "mesh")


def cases() -> dict[str, Any]:
    """Each case: a call of scikit-learn on (X, y, labels) returning what is compared."""
    from sklearn.decomposition import PCA
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.linear_model import LogisticRegression, Ridge, RidgeCV
    from sklearn.metrics import accuracy_score, mean_squared_error, pairwise_distances, r2_score
    from sklearn.naive_bayes import GaussianNB
    from sklearn.preprocessing import MinMaxScaler, StandardScaler

    return {
        "pca_full": lambda X, y, c: PCA(n_components=3, svd_solver="full").fit_transform(X),
        "pca_covariance_eigh": lambda X, y, c: PCA(
            n_components=3, svd_solver="covariance_eigh").fit_transform(X),
        "pca_randomized_qr": lambda X, y, c: PCA(
            n_components=3, svd_solver="randomized", power_iteration_normalizer="QR",
            random_state=0).fit_transform(X),
        "ridge": lambda X, y, c: Ridge(alpha=1.0, solver="svd").fit(X, y).predict(X),
        "logistic_regression": lambda X, y, c: LogisticRegression().fit(X, c).coef_,
        "ridge_cv": lambda X, y, c: RidgeCV(alphas=(0.1, 1.0, 10.0)).fit(X, y).coef_,
        "standard_scaler": lambda X, y, c: StandardScaler().fit_transform(X),
        "min_max_scaler": lambda X, y, c: MinMaxScaler().fit_transform(X),
        "lda": lambda X, y, c: LinearDiscriminantAnalysis().fit(X, c).predict_proba(X),
        "gaussian_nb": lambda X, y, c: GaussianNB().fit(X, c).predict_proba(X),
        "r2_score": lambda X, y, c: r2_score(y, 0.9 * y),
        "mean_squared_error": lambda X, y, c: mean_squared_error(y, 0.9 * y),
        "accuracy_score": lambda X, y, c: accuracy_score(c, (X[:, 0] > 0) * 1),
        "pairwise_distances": lambda X, y, c: pairwise_distances(X[:50], X[50:70]),
    }


def fit_in_a_child(backend: str, where: str, names: list[str],
                   timeout: float = 240) -> dict[str, dict[str, Any]]:
    """Run ``names`` on tensors of a ``backend`` cluster (``where``: one device or a mesh) in
    a child process; each case's measurements, by name."""
    environment = {**os.environ, "SCIPY_ARRAY_API": "1",
                   "JAX_PLATFORMS": "cpu"}  # (on a GPU host too: its CPU's devices)
    done = subprocess.run([sys.executable, __file__, backend, where, *names],
                          capture_output=True, text=True, timeout=timeout, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(backend: str, where: str, names: list[str]) -> None:
    import numpy as np
    import sklearn

    from fabric import LocalCluster
    from fabric.mesh.sharded import ShardedTensor

    sklearn.set_config(array_api_dispatch=True)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(ROWS, COLUMNS))
    y = X @ rng.normal(size=COLUMNS) + 0.1 * rng.normal(size=ROWS)
    labels = (X[:, 0] + 0.3 * rng.normal(size=ROWS) > 0).astype(np.int64)
    calls = cases()
    layout = {"workers": 1, "devices_per_worker": 2} if where == "mesh" else {"workers": 1}
    results = {}
    # (a jax device compiles each op it has not run before: seconds each on a busy machine)
    with LocalCluster(backend=backend, **layout) as cluster, \
            cluster.connect(timeout=120) as session:
        if where == "mesh":
            mesh = session.mesh()
            sessions = mesh.sessions
            tensors = [mesh.asarray(values, axis=0) for values in (X, y, labels)]
        else:
            sessions = [session]
            tensors = [session.asarray(values) for values in (X, y, labels)]

        def read() -> tuple[int, int]:
            each = [s.stats() for s in sessions]
            return sum(s["reads"] for s in each), sum(s["bytes_read"] for s in each)

        for name in names:
            before, started = read(), time.perf_counter()
            found = calls[name](*tensors)
            after, seconds = read(), time.perf_counter() - started
            kind = ("split along rows" if isinstance(found, ShardedTensor) and found.axis == 0
                    else "tensor" if hasattr(found, "__array_namespace__") or np.isscalar(found)
                    else type(found).__name__)
            found = found.numpy() if hasattr(found, "numpy") else np.asarray(found)
            expected = np.asarray(calls[name](X, y, labels))
            if name.startswith("pca"):  # (a component's sign is either)
                found, expected = np.abs(found), np.abs(expected)
            results[name] = {"difference": float(np.max(np.abs(found - expected))),
                             "dtype": str(found.dtype), "kind": kind,
                             "reads": after[0] - before[0], "bytes": after[1] - before[1],
                             "seconds": round(seconds, 3)}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
