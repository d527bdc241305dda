"""Eight numpy programs run on numpy and on a device, with only the upload changed.

    python bench/programs.py [--size small|full] [--repeats R] [--programs NAME ...]

Each program is one function ``program(xp, inputs)``: ``xp`` is where its arrays live
(``numpy`` itself, or a ``fabric`` session), and the program's only use of it is the upload,
``xp.asarray(...)``; everything else is plain numpy code (operators, ``np.*`` functions,
updates, masks), as a user would write it. The bench runs each program on numpy and on a
device of an embedded ``LocalCluster``, checks that the results agree (``np.allclose`` with
each program's stated tolerance), and prints the median time of R runs of each and their
ratio, then the latency of one read inside a loop. A program's result is read back (one
read) as part of its time on the device. Programs that read inside their loop (k-means'
masked means, PageRank's convergence test) pay one round trip per read: they are marked.

scipy, pandas and scikit-learn are not dependencies of fabric (the test extra installs them):
the programs that hand arrays to them run where the package is installed, and are listed as
skipped otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402


# -- the programs ------------------------------------------------------------------------------

def nbody(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """Softened gravity, leapfrog steps: pairwise distances by broadcasting."""
    pos, vel, mass = (xp.asarray(inputs[k]) for k in ("pos", "vel", "mass"))
    dt, soft = 0.01, 0.05
    for _ in range(int(inputs["steps"])):
        delta = pos[None, :, :] - pos[:, None, :]
        r2 = (delta ** 2).sum(axis=-1) + soft ** 2
        inverse = r2 ** -1.5
        inverse[np.eye(len(mass), dtype=bool)] = 0.0  # no self-force
        acc = (delta * (inverse * mass[None, :])[..., None]).sum(axis=1)
        vel += acc * dt
        pos += vel * dt
    return pos


def life(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """Conway's Game of Life on a torus: neighbours counted with np.roll."""
    grid = xp.asarray(inputs["grid"])
    for _ in range(int(inputs["steps"])):
        neighbours = sum(np.roll(np.roll(grid, dy, axis=0), dx, axis=1)
                         for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
        grid = ((neighbours == 3) | ((grid == 1) & (neighbours == 2))).astype(np.int8)
    return grid


def mlp(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """A two-layer perceptron trained by hand: ReLU, squared loss, gradient descent."""
    x, y = xp.asarray(inputs["x"]), xp.asarray(inputs["y"])
    w1, w2 = xp.asarray(inputs["w1"]), xp.asarray(inputs["w2"])
    rate = 1e-3
    for _ in range(int(inputs["steps"])):
        h = x @ w1
        relu = np.maximum(h, 0)
        error = relu @ w2 - y
        grad_w2 = relu.T @ error
        grad_h = error @ w2.T
        grad_h[h < 0] = 0
        grad_w1 = x.T @ grad_h
        w1 -= rate * grad_w1
        w2 -= rate * grad_w2
    return np.concatenate([w1.ravel(), w2.ravel()])


def pagerank(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """PageRank by power iteration, stopping when an iteration moves less than a tolerance
    (one read per iteration)."""
    links = xp.asarray(inputs["links"])
    n = links.shape[0]
    out_degree = links.sum(axis=0)
    out_degree[out_degree == 0] = 1
    transition = links / out_degree
    rank = np.full_like(out_degree, 1.0 / n)
    for _ in range(int(inputs["steps"])):
        new = 0.85 * (transition @ rank) + 0.15 / n
        if np.abs(new - rank).sum() < 1e-12:
            rank = new
            break
        rank = new
    return rank


def pca(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """PCA: covariance, np.linalg.eig, the data projected on the top components."""
    data = xp.asarray(inputs["x"])
    centred = data - data.mean(axis=0)
    values, vectors = np.linalg.eig(np.cov(centred, rowvar=False))
    order = np.argsort(values)[::-1][:3]
    components = vectors[:, order]
    components = components * np.sign(components[0])  # (each component's sign fixed)
    return centred @ components


def kmeans(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """k-means (Lloyd's): each centre the mean of its points, selected by a mask (a read of
    the mask's count per cluster per iteration)."""
    points, centres = xp.asarray(inputs["x"]), xp.asarray(inputs["centres"])
    for _ in range(int(inputs["steps"])):
        distances = ((points[:, None, :] - centres[None, :, :]) ** 2).sum(axis=-1)
        labels = distances.argmin(axis=1)
        for j in range(len(inputs["centres"])):
            members = points[labels == j]
            if len(members):
                centres[j] = members.mean(axis=0)
    return centres


def heat(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """The heat equation by an explicit five-point stencil, updated in place."""
    u = xp.asarray(inputs["u"])
    alpha = 0.2
    for _ in range(int(inputs["steps"])):
        u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * (u[2:, 1:-1] + u[:-2, 1:-1] + u[1:-1, 2:]
                                                 + u[1:-1, :-2] - 4 * u[1:-1, 1:-1])
    return u


def mandelbrot(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """The Mandelbrot set's escape counts: diverged points are held at 2 by a mask update."""
    c = xp.asarray(inputs["c"])
    z = np.zeros_like(c)
    counts = np.zeros_like(c, dtype=np.int32)
    for _ in range(int(inputs["steps"])):
        z = z * z + c
        diverged = np.abs(z) > 2
        z[diverged] = 2
        counts += ~diverged
    return counts


def scipy_minimize(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """scipy.optimize.minimize of a least-squares objective computed on ``xp``'s arrays."""
    from scipy.optimize import minimize
    a, b = xp.asarray(inputs["a"]), xp.asarray(inputs["b"])

    def objective(w: np.ndarray) -> float:
        return float(((a @ w - b) ** 2).sum())
    return minimize(objective, np.zeros(a.shape[1]), method="BFGS").x


def pandas_frame(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """A pandas DataFrame built from ``xp``'s array, grouped and averaged."""
    import pandas
    table = xp.asarray(inputs["x"])
    frame = pandas.DataFrame(np.asarray(table * 2.0), columns=["a", "b", "c"])
    return frame.groupby(frame["a"] > 0).mean().to_numpy()


def sklearn_kmeans(xp: Any, inputs: dict[str, np.ndarray]) -> Any:
    """scikit-learn's KMeans fitted on ``xp``'s array."""
    from sklearn.cluster import KMeans
    points = xp.asarray(inputs["x"])
    model = KMeans(n_clusters=3, n_init=1, random_state=0).fit(points)
    return np.sort(model.cluster_centers_, axis=0)


# -- their inputs ------------------------------------------------------------------------------

def _inputs(size: str) -> dict[str, dict[str, Any]]:
    """Each program's inputs at ``size`` ("small": for tests; "full": the bench)."""
    full = size == "full"
    rng = np.random.default_rng(0)
    bodies, cells, samples = (256, 256, 2000) if full else (24, 16, 200)
    steps = 20 if full else 3
    links = (rng.random((400 if full else 30,) * 2) < 0.05).astype(float)
    real, imag = np.meshgrid(np.linspace(-2, 0.6, 400 if full else 24),
                             np.linspace(-1.2, 1.2, 300 if full else 18))
    blobs = np.concatenate([rng.normal(centre, 0.3, (samples // 4, 2))
                            for centre in ((0, 0), (3, 3), (0, 4), (4, 0))])
    return {
        "n-body": {"pos": rng.normal(size=(bodies, 3)), "vel": np.zeros((bodies, 3)),
                   "mass": rng.uniform(0.5, 1.0, bodies), "steps": steps},
        "game of life": {"grid": (rng.random((cells, cells)) < 0.3).astype(np.int8),
                         "steps": 4 * steps},
        "mlp": {"x": rng.normal(size=(samples, 16)), "y": rng.normal(size=(samples, 1)),
                "w1": rng.normal(size=(16, 32)) * 0.1, "w2": rng.normal(size=(32, 1)) * 0.1,
                "steps": 4 * steps},
        "pagerank": {"links": links, "steps": 100},
        "pca": {"x": rng.normal(size=(samples, 20)) @ rng.normal(size=(20, 20))},
        "k-means": {"x": blobs, "centres": blobs[:: len(blobs) // 4][:4].copy(),
                    "steps": steps // 2 or 1},
        "heat": {"u": np.pad(np.ones((cells - 2, cells - 2)), 1), "steps": 5 * steps},
        "mandelbrot": {"c": real + 1j * imag, "steps": 2 * steps},
        "scipy minimize": {"a": rng.normal(size=(50, 4)), "b": rng.normal(size=50)},
        "pandas": {"x": rng.normal(size=(samples, 3))},
        "scikit-learn KMeans": {"x": blobs},
    }


class Program(NamedTuple):
    """A program, the package it hands arrays to (None: numpy only), its results'
    tolerance (np.allclose's rtol and atol), and whether it reads inside its loop."""

    run: Callable[[Any, dict[str, Any]], Any]
    package: str | None
    tolerance: float
    reads_in_loop: bool


PROGRAMS = {
    "n-body": Program(nbody, None, 1e-9, False),
    "game of life": Program(life, None, 0, False),
    "mlp": Program(mlp, None, 1e-9, False),
    "pagerank": Program(pagerank, None, 1e-9, True),
    "pca": Program(pca, None, 1e-8, True),  # (eig's dtype: one round trip)
    "k-means": Program(kmeans, None, 1e-9, True),
    "heat": Program(heat, None, 1e-12, False),
    "mandelbrot": Program(mandelbrot, None, 0, False),
    "scipy minimize": Program(scipy_minimize, "scipy", 1e-6, True),
    "pandas": Program(pandas_frame, "pandas", 1e-12, True),
    "scikit-learn KMeans": Program(sklearn_kmeans, "sklearn", 1e-6, True),
}


def installed(package: str | None) -> bool:
    """Whether ``package`` (None: numpy alone) can be imported here."""
    if package is None:
        return True
    try:
        __import__(package)
    except ImportError:
        return False
    return True


def fresh(inputs: dict[str, Any]) -> dict[str, Any]:
    """A copy of a program's inputs: on numpy, ``np.asarray`` does not copy, so a program's
    updates would change them for the next run (a device's upload is a copy)."""
    return {key: np.copy(value) for key, value in inputs.items()}


def run_both(name: str, session: Any, size: str = "small") -> tuple[np.ndarray, np.ndarray]:
    """Program ``name`` on numpy and on ``session``'s device: both results, as arrays."""
    inputs = _inputs(size)[name]
    program = PROGRAMS[name].run
    return np.asarray(program(np, fresh(inputs))), np.asarray(program(session, inputs))


# -- the bench ---------------------------------------------------------------------------------

def _median_seconds(call: Callable[..., Any], repeats: int,
                    prepare: Callable[[], Any] = tuple) -> float:
    # the median time of call(*prepare()), prepare's own time left out
    times = []
    for _ in range(repeats):
        args = prepare()
        start = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def read_latency_ms(session: Any, reads: int) -> float:
    """The median time of one iteration of a loop that updates a small tensor and reads one
    value of it (``float(t[0])``), as a program's convergence test does."""
    t = session.asarray(np.zeros(64))
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        t += 1.0
        float(t[0])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["small", "full"], default="full")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--programs", nargs="+", choices=list(PROGRAMS), metavar="NAME",
                        default=list(PROGRAMS), help="run only these programs")
    options = parser.parse_args()
    all_inputs = _inputs(options.size)  # (run_both makes them again: the same seed)
    print(f"{'program':22} {'numpy ms':>10} {'device ms':>10} {'ratio':>7}  agrees  note")
    with fabric.LocalCluster(workers=1) as cluster, cluster.connect() as session:
        for name in options.programs:
            program = PROGRAMS[name]
            if not installed(program.package):
                print(f"{name:22} {'':>10} {'':>10} {'':>7}  -       skipped: "
                      f"{program.package} is not installed")
                continue
            inputs = all_inputs[name]
            try:
                expected, got = run_both(name, session, options.size)
            except Exception as exc:  # a program that does not run unchanged: say why
                print(f"{name:22} does not run unchanged: {type(exc).__name__}: {exc}")
                continue
            agrees = got.shape == expected.shape and np.allclose(
                got, expected, rtol=program.tolerance, atol=program.tolerance)
            local = _median_seconds(lambda copied: program.run(np, copied), options.repeats,
                                    lambda: (fresh(inputs),))
            remote = _median_seconds(lambda: np.asarray(program.run(session, inputs)),
                                     options.repeats)
            note = "reads in its loop" if program.reads_in_loop else ""
            print(f"{name:22} {local * 1e3:10.1f} {remote * 1e3:10.1f} {remote / local:7.2f}  "
                  f"{'yes' if agrees else 'NO':7} {note}")
        print(f"\nread latency inside a loop (t += 1; float(t[0])): "
              f"{read_latency_ms(session, 200):.3f} ms median; numpy's same loop: "
              f"{_median_seconds(lambda: float(np.zeros(64)[0] + 1.0), 200) * 1e3:.4f} ms")


if __name__ == "__main__":
    main()
