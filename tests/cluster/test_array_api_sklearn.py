"""scikit-learn unchanged on fabric tensors (``array_api_dispatch=True``, SciPy's array API
flag): its estimators and metrics take ``t.__array_namespace__()`` and compute on the device,
a numpy device and a jax device (XLA on the CPU) alike.

Each backend's cases run in one child process (``sklearn_fits``) on a real one-worker
cluster: the result within 1e-8 of the same estimator on numpy arrays, and what the client
read back while fitting, counted by the session's stats (``reads``, ``bytes_read``): a few
scalars the estimator branches on, never the data.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from sklearn_fits import fit_in_a_child

pytest.importorskip("sklearn")
# (a jax device compiles each op the first time it runs it: a minute for all cases here)
pytestmark = pytest.mark.timeout(300)

# (case, the most bytes its fit may read back: X is 4000 x 8 float64, 256,000 bytes)
CASES = {"pca_full": 8, "pca_randomized_qr": 8, "ridge": 64, "ridge_cv": 2048,
         "standard_scaler": 64, "min_max_scaler": 64, "lda": 256, "gaussian_nb": 256,
         "r2_score": 64, "mean_squared_error": 64, "accuracy_score": 64,
         "pairwise_distances": 64,
         # scipy's L-BFGS runs here, on numpy: each iteration reads the loss and gradient
         "logistic_regression": 4096}
BACKENDS = ["numpy", pytest.param("jax", marks=pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed"))]


@pytest.fixture(scope="module", params=BACKENDS)
def measured(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    return fit_in_a_child(request.param, "device", sorted(CASES))


@pytest.mark.parametrize("case", sorted(CASES))
def test_scikit_learn_runs_on_the_device(measured: dict[str, dict[str, Any]],
                                         case: str) -> None:
    result = measured[case]
    assert result["difference"] <= 1e-8 and result["dtype"] == "float64", result
    assert result["kind"] == "tensor", f"{case} returned no tensor: {result}"
    assert result["bytes"] <= CASES[case], f"{case} read back more than it branches on: {result}"
