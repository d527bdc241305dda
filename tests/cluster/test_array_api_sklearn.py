"""scikit-learn unchanged on fabric tensors (``array_api_dispatch=True``, SciPy's array API
flag): its estimators and metrics take ``t.__array_namespace__()`` and compute on the device.

Each case runs in one child process (SciPy reads ``SCIPY_ARRAY_API`` when it is first
imported, which another test may have done here) on a real one-worker cluster: the result
within 1e-8 of the same estimator on numpy arrays, and what the client read back while
fitting, counted by the session's stats (``reads``, ``bytes_read``): a few scalars the
estimator branches on, never the data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")

# (case, the most bytes its fit may read back: X is 4000 x 8 float64, 256,000 bytes)
CASES = {"pca": 8, "pca_randomized_qr": 8, "ridge": 64, "ridge_cv": 2048,
         "standard_scaler": 64, "min_max_scaler": 64, "lda": 256, "gaussian_nb": 256,
         "r2_score": 64, "mean_squared_error": 64, "accuracy_score": 64,
         "pairwise_distances": 64,
         # scipy's L-BFGS runs here, on numpy: each iteration reads the loss and gradient
         "logistic_regression": 4096}

PROGRAM = r'''
import json, sys
import numpy as np, sklearn
from fabric import LocalCluster
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.linear_model import LogisticRegression, Ridge, RidgeCV
from sklearn.metrics import accuracy_score, mean_squared_error, pairwise_distances, r2_score
from sklearn.naive_bayes import GaussianNB
from sklearn.preprocessing import MinMaxScaler, StandardScaler

sklearn.set_config(array_api_dispatch=True)
rng = np.random.default_rng(0)
X = rng.normal(size=(4000, 8))
y = X @ rng.normal(size=8) + 0.1 * rng.normal(size=4000)
labels = (X[:, 0] + 0.3 * rng.normal(size=4000) > 0).astype(np.int64)
CASES = {
    "pca": lambda X, y, c: PCA(n_components=3, svd_solver="full").fit_transform(X),
    "pca_randomized_qr": lambda X, y, c: PCA(n_components=3, svd_solver="randomized",
        power_iteration_normalizer="QR", random_state=0).fit_transform(X),
    "ridge": lambda X, y, c: Ridge(alpha=1.0, solver="svd").fit(X, y).coef_,
    "logistic_regression": lambda X, y, c: LogisticRegression().fit(X, c).coef_,
    "ridge_cv": lambda X, y, c: RidgeCV(alphas=(0.1, 1.0, 10.0)).fit(X, y).coef_,
    "standard_scaler": lambda X, y, c: StandardScaler().fit_transform(X),
    "min_max_scaler": lambda X, y, c: MinMaxScaler().fit_transform(X),
    "lda": lambda X, y, c: LinearDiscriminantAnalysis().fit(X, c).predict_proba(X),
    "gaussian_nb": lambda X, y, c: GaussianNB().fit(X, c).predict_proba(X),
    "r2_score": lambda X, y, c: r2_score(y, 0.9 * y),
    "mean_squared_error": lambda X, y, c: mean_squared_error(y, 0.9 * y),
    "accuracy_score": lambda X, y, c: accuracy_score(c, c[::-1]),
    "pairwise_distances": lambda X, y, c: pairwise_distances(X[:50], X[50:70]),
}
results = {}
with LocalCluster(workers=1) as cluster, cluster.connect() as session:
    tensors = (session.asarray(X), session.asarray(y), session.asarray(labels))
    for name in sys.argv[1:]:
        before = session.stats()
        found = CASES[name](*tensors)
        on_device = hasattr(found, "__array_namespace__") or np.isscalar(found)
        after = session.stats()
        found = found.numpy() if hasattr(found, "numpy") else np.asarray(found)
        expected = np.asarray(CASES[name](X, y, labels))
        if name.startswith("pca"):  # (a component's sign is either)
            found, expected = np.abs(found), np.abs(expected)
        results[name] = {"difference": float(np.max(np.abs(found - expected))),
                         "tensor": bool(on_device), "reads": after["reads"] - before["reads"],
                         "bytes": after["bytes_read"] - before["bytes_read"]}
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, float]]:
    environment = {**os.environ, "SCIPY_ARRAY_API": "1"}
    done = subprocess.run([sys.executable, "-c", PROGRAM, *CASES], capture_output=True,
                          text=True, timeout=240, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_scikit_learn_runs_on_the_device(measured: dict[str, dict[str, float]],
                                         case: str) -> None:
    result = measured[case]
    assert result["difference"] <= 1e-8, result
    assert result["tensor"], f"{case} returned a numpy result, not a tensor: {result}"
    assert result["bytes"] <= CASES[case], f"{case} read back more than it branches on: {result}"
