"""End to end: each numpy program of ``bench/programs.py`` (n-body, Game of Life, a hand-
trained MLP, PageRank, PCA, k-means, a heat stencil, Mandelbrot, and those that hand arrays
to scipy, pandas and scikit-learn, which the test extra installs) runs unchanged on a real device,
its only change the upload, and gives numpy's results within its stated tolerance. Small sizes;
no timing is asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_programs", Path(__file__).resolve().parents[2] / "bench" / "programs.py")
programs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(programs)


@pytest.mark.parametrize("name", list(programs.PROGRAMS))
def test_a_program_runs_unchanged_on_a_device_and_agrees_with_numpy(session, name):
    program = programs.PROGRAMS[name]
    if not programs.installed(program.package):
        pytest.skip(f"{program.package} is not installed (not a dependency of fabric; "
                    "pip install -e '.[test]' installs it)")
    expected, got = programs.run_both(name, session, "small")
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=program.tolerance, atol=program.tolerance)
    session.sync()
