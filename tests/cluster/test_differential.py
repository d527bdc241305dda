"""Random chains of ops, run by numpy and by a real device (numpy's and numexpr's, op by op
and as a registered and replayed ``fabric.function``), must agree.

Each example builds a short chain (elementwise ops with tensors and with Python and numpy
scalars, reductions, views, casts, joins, scans, updates, and selections whose shape depends
on the data, numpy's everyday functions and linear algebra) from random dtypes and small
shapes. A ``fabric.function`` refuses updates, data-dependent shapes and uploads, so its
chains stop before the first. At every step the tensor's shape and dtype, known on the
client before anything is read, must be numpy's, and where numpy refuses, fabric must
refuse at the call with the same exception type; at the end the values read back must be
numpy's. An error that depends on the values (numpy refuses these, not others of the same
shapes and dtypes: ``svd`` of NaNs does not converge) cannot be known at the call without
reading them: fabric may raise it there, or else at the read, as the device's
``RemoteError`` that names numpy's exception type. Seeded (derandomized), so CI is
repeatable; ``FABRIC_DIFFERENTIAL_EXAMPLES=N`` runs N random examples instead; the chains
once found to disagree run first on every draw.

The jax device is held to numpy's own tolerances: XLA's transcendental functions differ from
numpy's in the last bits only (at most 16 ulp in float64, 129 for arctanh near +-1, and 10
in float32: ``tests/unit/test_jax_executor.py`` measures them), well inside them.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from value_edges import converts_as_x86

import fabric
from fabric import Tensor
from fabric.core.errors import RemoteError

DTYPES = ["bool", "int32", "int64", "float32", "float64"]
SHAPES = [(), (3,), (2, 3), (1, 3), (2, 1, 3), (0, 3)]
BINARY = ["add", "subtract", "multiply", "true_divide", "floor_divide", "remainder", "maximum",
          "minimum", "less", "equal", "not_equal", "greater_equal", "logical_and",
          "logical_xor", "bitwise_and", "bitwise_or", "arctan2", "hypot", "copysign",
          "logaddexp", "heaviside", "fmax"]
UNARY = ["negative", "absolute", "sqrt", "exp", "log1p", "sin", "tanh", "floor", "sign",
         "isnan", "logical_not", "invert", "square", "rint", "fabs", "signbit"]
REDUCTIONS = ["sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax", "any",
              "all"]
SCALARS = st.sampled_from([True, 0, 3, -2, 250, 2**40, -2**63, 2.5, -0.5, -0.0, float("nan"),
                           float("inf"), np.bool_(False), np.int8(3), np.uint8(200),
                           np.int32(-7), np.float16(0.5), np.float32(1.5), np.float64(-2.0)])


def _axis(draw: st.DrawFn, ndim: int) -> int | None:
    return draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1))) if ndim else None


# Ops whose results numexpr rounds otherwise than numpy (within an ulp or so, which a later
# cast or comparison can turn into any difference): kept off the numexpr device's chains
INEXACT = {"arctan2", "hypot", "logaddexp", "exp", "log1p", "sin", "tanh"}


@st.composite
def chains(draw: st.DrawFn, exact: bool = False) -> tuple[list[np.ndarray], list[tuple]]:
    """Base arrays and a list of steps, each (kind, arguments) applied to the running value;
    ``exact``: only ops that numpy and numexpr round alike."""
    binary = [name for name in BINARY if not (exact and name in INEXACT)]
    unary = [name for name in UNARY if not (exact and name in INEXACT)]
    shape = draw(st.sampled_from(SHAPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    bases = []
    for _ in range(2):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        other_shape = draw(st.sampled_from([shape, shape[1:], (1,) + shape[1:]]))
        values = np.asarray(rng.integers(-4, 5, other_shape) * 0.75)  # zeros, ties
        if dtype.kind == "f" and values.size and draw(st.booleans()):
            values.reshape(-1)[0] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        # (a 0-d array, not a numpy scalar: those take axis=0 where arrays refuse it)
        bases.append(np.asarray(values.astype(dtype) if dtype.kind != "b" else values > 0))
    steps = []
    ndim = len(shape)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["binary", "binary", "scalar", "unary", "reduce", "view",
                                     "astype", "where", "clip", "join", "scan", "matmul",
                                     "other", "update", "select"]))
        if kind == "binary":
            steps.append((kind, (draw(st.sampled_from(binary)), draw(st.booleans()))))
        elif kind == "scalar":
            steps.append((kind, (draw(st.sampled_from(binary)), draw(SCALARS),
                                 draw(st.booleans()))))
        elif kind == "unary":
            steps.append((kind, (draw(st.sampled_from(unary)),)))
        elif kind == "reduce":
            name = draw(st.sampled_from(REDUCTIONS))
            extra = {}
            if name in ("sum", "prod", "min", "max") and draw(st.booleans()):
                extra["initial"] = draw(st.sampled_from([1, -2.5, True]))
            if name in ("sum", "prod", "mean") and draw(st.booleans()):
                extra["dtype"] = draw(st.sampled_from(DTYPES))
            steps.append((kind, (name, _axis(draw, ndim), draw(st.booleans()), extra)))
        elif kind == "view":
            steps.append((kind, (draw(st.sampled_from(["T", "flat", "expand", "reverse",
                                                        "first", "squeeze"])),)))
        elif kind == "astype":
            steps.append((kind, (draw(st.sampled_from(DTYPES)),)))
        elif kind == "other":
            steps.append((kind, (draw(st.sampled_from(["round", "isclose", "nan_to_num",
                                                        "moveaxis", "outer", "divmod", "flip",
                                                        "diff", "roll", "tril", "repeat",
                                                        "tile", "einsum", *FUNCTIONS])),)))
        elif kind == "update":
            steps.append((kind, (draw(st.sampled_from(list(UPDATES))),)))
        elif kind == "select":
            steps.append((kind, (draw(st.sampled_from(list(SELECTIONS))),)))
        elif kind in ("where", "clip", "join", "matmul"):
            steps.append((kind, (draw(st.integers(0, 1)),)))
        else:
            steps.append((kind, (draw(st.sampled_from(["cumsum", "sort", "argsort"])),
                                 _axis(draw, ndim))))
    return bases, steps


def _updated(update):
    """An update of a copy of the running value (numpy's in-place rules: casting, broadcast)."""
    def run(value, other):
        value = value.copy()
        update(value, other)
        return value
    return run


def _at(value, other):
    np.add.at(value, [0, -1, 0], 1)


UPDATES = {
    "mask = 7": _updated(lambda v, o: v.__setitem__(v > 0, 7)),
    "mask *= 2": _updated(lambda v, o: v.__setitem__(v != 0, v[v != 0] * 2)),
    "+= other": _updated(lambda v, o: v.__iadd__(o)),
    "*= 1.5": _updated(lambda v, o: v.__imul__(1.5)),
    "[[0, 0]] -= 1": _updated(lambda v, o: v.__setitem__([0, 0], v[[0, 0]] - 1)),
    "[..., :1] = other": _updated(lambda v, o: v.__setitem__((Ellipsis, slice(None, 1)),
                                                             o[..., :1])),
    "np.add.at": _updated(_at),
    "out=": _updated(lambda v, o: np.maximum(v, o, out=v)),
}
SELECTIONS = {
    "mask": lambda v, o: v[v > 0],
    "other's mask": lambda v, o: v[o.astype(bool)],
    "fancy": lambda v, o: v[[-1, 0, 0]],
    "nonzero": lambda v, o: np.nonzero(v)[-1],
    "unique": lambda v, o: np.unique(v),
    "bincount": lambda v, o: np.bincount((v != 0).ravel().astype(np.int8)),
}
# (the functions that upload an array of their own, which a traced function refuses)
UPLOADS = {"take", "solve"}
# numpy's everyday functions on the running value (``v``) and the other base (``o``)
FUNCTIONS = {
    "flipud": lambda v, o: np.flipud(v),
    "fliplr": lambda v, o: np.fliplr(v),
    "atleast_3d": lambda v, o: np.atleast_3d(v),
    "median": lambda v, o: np.median(v, axis=-1),
    "percentile": lambda v, o: np.percentile(v, [25, 50]),
    "quantile": lambda v, o: np.quantile(v, 0.5, axis=0, method="lower"),
    "pad": lambda v, o: np.pad(v, 1, mode="edge"),
    "meshgrid": lambda v, o: np.meshgrid(np.ravel(v), np.ravel(o))[1],
    "take": lambda v, o: np.take(v, [0, -1], axis=-1),
    "diag": lambda v, o: np.diag(v),
    "split": lambda v, o: np.array_split(v, 2, axis=-1)[-1],
    "append": lambda v, o: np.append(v, o),
    "sum where": lambda v, o: np.sum(v, axis=-1, where=o != 0),
    "mean where": lambda v, o: np.mean(v, where=v > 0),
    "max where": lambda v, o: np.max(v, axis=0, where=o > 0, initial=-2),
    "cov": lambda v, o: np.cov(v),
    "norm": lambda v, o: np.linalg.norm(v, 1, axis=-1),
    "matrix norm": lambda v, o: np.linalg.norm(v, np.inf),
    "det": lambda v, o: np.linalg.det(v[..., :1, :1]),
    "solve": lambda v, o: np.linalg.solve(np.ones((2, 2)) + np.eye(2), np.ones(2) * v[..., 0]),
    "svd": lambda v, o: np.linalg.svd(v, compute_uv=False),
    "nanmean": lambda v, o: np.nanmean(v, axis=0),
    "nanmax": lambda v, o: np.nanmax(v, axis=-1),
    "ptp": lambda v, o: np.ptp(v, axis=0),
    "average": lambda v, o: np.average(v, axis=-1),
    "add.reduce": lambda v, o: np.add.reduce(v, axis=-1),
    "maximum.accumulate": lambda v, o: np.maximum.accumulate(v, axis=0),
    "corrcoef": lambda v, o: np.corrcoef(v),
}


def apply(step: tuple[str, tuple], value, other):
    """One step on ``value`` (a numpy array or a tensor), ``other`` being the second base."""
    kind, args = step
    if kind == "binary":
        name, swapped = args
        return getattr(np, name)(*((other, value) if swapped else (value, other)))
    if kind == "scalar":
        name, scalar, swapped = args
        return getattr(np, name)(*((scalar, value) if swapped else (value, scalar)))
    if kind == "unary":
        return getattr(np, args[0])(value)
    if kind == "reduce":
        name, axis, keepdims, extra = args
        return getattr(value, name)(axis=axis, keepdims=keepdims, **extra)
    if kind == "view":
        how = args[0]
        return {"T": lambda v: v.T, "flat": lambda v: v.reshape(-1),
                "expand": lambda v: np.expand_dims(v, 0), "reverse": lambda v: v[..., ::-1],
                "first": lambda v: v[0], "squeeze": lambda v: np.squeeze(v)}[how](value)
    if kind == "astype":
        return value.astype(args[0])
    if kind == "update":
        return UPDATES[args[0]](value, other)
    if kind == "select":
        return SELECTIONS[args[0]](value, other)
    if kind == "where":
        return np.where(value > 0, value, other) if args[0] else np.where(other, 1.5, value)
    if kind == "clip":
        return np.clip(value, -1, 2) if args[0] else value.clip(other, None)
    if kind == "join":
        return np.concatenate([value, value], axis=-1) if args[0] else np.stack([value, value])
    if kind == "matmul":
        return value @ other if args[0] else np.dot(other, value)
    if kind == "other":
        return {"round": lambda v: np.round(v * 0.37, 1),
                "isclose": lambda v: np.isclose(v, other),
                "nan_to_num": lambda v: np.nan_to_num(v / other, posinf=7.0),
                "moveaxis": lambda v: np.moveaxis(v, 0, -1),
                "outer": lambda v: np.outer(v, other),
                "divmod": lambda v: divmod(v, other)[1],
                "flip": lambda v: np.flip(v, axis=0),
                "diff": lambda v: np.diff(v, axis=0),
                "roll": lambda v: np.roll(v, 2, axis=-1),
                "tril": lambda v: np.tril(v, -1),
                "repeat": lambda v: np.repeat(v, 2, axis=-1),
                "tile": lambda v: np.tile(v, (2, 1)),
                "einsum": lambda v: np.einsum("...i,...i->...", v, other),
                **{name: lambda v, f=f: f(v, other) for name, f in FUNCTIONS.items()},
                }[args[0]](value)
    name, axis = args
    if name == "argsort":  # (numpy's default kind leaves the order of ties unspecified)
        return np.argsort(value, axis=axis, kind="stable")
    return getattr(np, name)(value, axis=axis)


def apply_with_numpy(step: tuple[str, tuple], value: np.ndarray, other: np.ndarray
                     ) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the mean of nothing, say)
        return np.asarray(apply(step, value, other))


def assert_same_values(got: np.ndarray, expected: np.ndarray, label: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, label
    if expected.dtype.kind == "f":
        tolerance = {2: 2e-3, 4: 2e-5, 8: 1e-12}[expected.dtype.itemsize]
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance,
                                   equal_nan=True, err_msg=label)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=label)


def depends_on_values(step: tuple[str, tuple], value: np.ndarray, other: np.ndarray) -> bool:
    """Whether numpy accepts ``step`` on other values (ones) of the same shapes and dtypes:
    where it refuses ``value`` and ``other``, it refuses their values, not their types."""
    try:
        apply_with_numpy(step, np.ones_like(value), np.ones_like(other))
    except Exception:
        return False
    return True


def check(session, chain) -> None:
    """Run ``chain`` with numpy and on ``session``'s device; they must agree at every step."""
    bases, steps = chain
    local, other_local = bases
    remote, other_remote = (session.asarray(b) for b in bases)
    for i, step in enumerate(steps):
        label = f"step {i} {step} of {steps} on {[(b.dtype, b.shape) for b in bases]}"
        try:
            local = apply_with_numpy(step, local, other_local)
        except Exception as exc:  # numpy refuses: fabric refuses alike, at the call
            if not depends_on_values(step, local, other_local):
                with pytest.raises(type(exc)):
                    apply(step, remote, other_remote)
                break
            try:  # (or, refusing the values, at the read: the device's error names it)
                result = apply(step, remote, other_remote)
            except type(exc):
                break
            with pytest.raises(RemoteError, match=type(exc).__name__):
                result.numpy()
            break
        remote = apply(step, remote, other_remote)
        assert isinstance(remote, Tensor), label
        assert (remote.shape, remote.dtype) == (local.shape, local.dtype), label
    assert_same_values(remote.numpy(), local, f"{steps} on {[b.dtype for b in bases]}")


def check_graph(session, chain) -> None:
    """The part of ``chain`` numpy accepts, as a ``fabric.function`` registered on its first
    call and replayed on its second, must give numpy's values both times."""
    bases, steps = chain
    local, other = bases
    accepted = []
    for step in steps:
        if step[0] in ("update", "select") or step[1][0] in UPLOADS:  # (refused while
            break  # tracing)
        try:
            local = apply_with_numpy(step, local, other)
        except Exception:
            break
        accepted.append(step)

    @fabric.function
    def run(value, other):
        for step in accepted:
            value = apply(step, value, other)
        return value
    remote = [session.asarray(b) for b in bases]
    for call in ("registered", "replayed"):
        assert_same_values(run(*remote).numpy(), local, f"{call}: {accepted} on "
                                                        f"{[b.dtype for b in bases]}")


EXAMPLE_COUNT = int(os.environ.get("FABRIC_DIFFERENTIAL_EXAMPLES", 300))
pytestmark = pytest.mark.timeout(max(60, EXAMPLE_COUNT // 40))  # (a long exploration: longer)
EXAMPLES = settings(max_examples=EXAMPLE_COUNT,
                    deadline=None,
                    derandomize="FABRIC_DIFFERENTIAL_EXAMPLES" not in os.environ, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def seen(*examples: tuple[list[np.ndarray], list[tuple]]):
    """The chains once found to disagree, each run first on every draw (hypothesis's
    explicit examples)."""
    def decorate(test):
        for chain in reversed(examples):
            test = example(chain=chain)(test)
        return test
    return decorate


_EMPTY = np.empty((0, 3), bool), np.empty((0, 3), np.float32)
# Each refused at the call by numpy's check of an empty axis, made before its types: a
# quantile's (IndexError, also of bools, which numpy's subtract would refuse), ptp's of bools
# (ValueError, not the subtract's TypeError), take's and pad's.
EMPTY_AXES = [([_EMPTY[1], _EMPTY[0]], [("other", ("percentile",))]),
              ([_EMPTY[0], _EMPTY[0]], [("other", ("percentile",))]),
              ([_EMPTY[0], _EMPTY[0]], [("other", ("quantile",))]),
              ([_EMPTY[0], _EMPTY[1]], [("other", ("ptp",))]),
              ([_EMPTY[1], _EMPTY[0]], [("view", ("T",)), ("other", ("take",))]),
              ([_EMPTY[0], _EMPTY[0]], [("other", ("pad",))])]
# numpy's svd of NaNs does not converge: a LinAlgError of the values (every device raises it
# at the read; XLA's SVD gives NaNs, which the jax device refuses as numpy does)
NOT_CONVERGING = ([np.array([[np.nan, 1.5, 0.0], [-0.75, 3.0, 2.25]]), np.ones((2, 3))],
                  [("other", ("svd",))])
_TIES = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
# Once different on the jax device: a quantile that picks a value keeps a bool's and an
# int's dtype (jax's computes in a float), argsort's ties in numpy's stable order, and a
# product of zeros (a bool's False too) and NaNs is NaN, in numpy's dtype
JAX_SEEN = [([_TIES > 0, _TIES], [("other", ("quantile",))]),
            ([_TIES.astype(np.int32), _TIES], [("other", ("quantile",))]),
            ([_TIES, _TIES], [("scan", ("argsort", None))]),
            ([_TIES.astype(np.int64), _TIES], [("join", (0,)), ("scan", ("argsort", -1))]),
            ([_TIES > 2, np.array([[np.nan, 1.0, np.inf]] * 2)], [("matmul", (0,))]),
            ([np.array([[np.nan, 1.0, np.inf]] * 2), _TIES == 0], [("view", ("T",)),
                                                                  ("matmul", (1,))])]

_CONVERTED = np.array([[np.nan, np.inf, -1.0], [-3.0e9, 3.0e9, 1e20]])
# Where XLA (and CUDA) compute otherwise from the values (tests/value_edges.py has more): a
# float converted to an unsigned integer (-1.0 to uint32: XLA's is 0, numpy's 4294967295), an
# integer to a negative power, divided by zero, a float's floor division and remainder
VALUE_EDGES = [*([([_CONVERTED, _TIES], [("astype", ("uint64",))]),
                  ([np.array([[-1.0, -3.5, 3.0e9]] * 2), _TIES], [("astype", ("uint32",))]),
                  ([_CONVERTED, _TIES], [("astype", ("int32",))])]
                 if converts_as_x86(_CONVERTED) else []),  # (else numpy's are this CPU's)
               ([np.array([[2, 3, -1]] * 2), np.array([[-1, 2, -3]] * 2)],
                [("binary", ("power", False))]),
               ([np.array([[7, -7, 0]] * 2, np.int32), np.zeros((2, 3), np.int32)],
                [("binary", ("floor_divide", False)), ("binary", ("remainder", True))]),
               ([np.array([[1.0, -1.0, 5.0]] * 2), np.array([[0.1, np.inf, -0.0]] * 2)],
                [("binary", ("floor_divide", False)), ("binary", ("remainder", True))])]


@EXAMPLES
@seen(*EMPTY_AXES, NOT_CONVERGING)
@given(chains())
def test_random_chains_agree_with_numpy(session, chain):
    check(session, chain)


@EXAMPLES
@seen(*EMPTY_AXES, NOT_CONVERGING)
@given(chains(exact=True))
def test_random_chains_agree_with_numpy_on_the_numexpr_device(numexpr_session, chain):
    check(numexpr_session, chain)


@EXAMPLES
@given(chains())
def test_random_chains_as_graphs_agree_with_numpy(session, chain):
    check_graph(session, chain)


@EXAMPLES
@given(chains(exact=True))
def test_random_chains_as_graphs_agree_with_numpy_on_the_numexpr_device(numexpr_session, chain):
    check_graph(numexpr_session, chain)


@pytest.mark.timeout(900)
@EXAMPLES
@seen(*EMPTY_AXES, NOT_CONVERGING, *JAX_SEEN, *VALUE_EDGES)
@given(chains())
def test_random_chains_agree_with_numpy_on_the_jax_device(jax_session, chain):
    check(jax_session, chain)


@pytest.mark.timeout(900)
@EXAMPLES
@seen(*JAX_SEEN, *VALUE_EDGES)
@given(chains())
def test_random_chains_as_graphs_agree_with_numpy_on_the_jax_device(jax_session, chain):
    check_graph(jax_session, chain)
