"""CI's judge of ``fabric.array_api``: every function of the namespace, run on a real cluster,
against ``array_api_strict`` (the standard's reference, on the package index) on the same
inputs: the same result dtype, shape and values, NaNs and signed zeros included, and an error
where it raises one.

Hypothesis draws the shapes (empty ones too), the dtypes (those of the standard's thirteen that
array-api-strict takes for the function, found by asking it: so the standard's promotion table
decides which pairs are drawn), the values (NaN, infinities, signed zeros, each integer
dtype's extremes) and the keywords. A Python scalar stands in for the second operand of an
elementwise function now and then. Examples are derandomized and few per function, so that
the file stays well under two minutes on a loaded machine; the external suite
(data-apis/array-api-tests, run by hand) explores further.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fabric.array_api.elementwise import BINARY, UNARY

array_api_strict.set_array_api_strict_flags(api_version="2024.12")

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128"]
EXAMPLES = 15


@dataclass(frozen=True)
class Case:
    """One function's call on either namespace (``call(ns, *arrays, **keywords)``), how its
    inputs are shaped, the keywords drawn for a shape, and whether values may differ by
    rounding (composites that sum in another order)."""

    call: Callable[..., Any]
    shapes: str = "any"  # any, nonscalar, broadcast, same, matrix, square, matmul, sorted
    keywords: Callable[[tuple[int, ...]], st.SearchStrategy[dict[str, Any]]] = \
        field(default=lambda shape: st.just({}))
    rounding: bool = False
    scalars: bool = False  # the second operand is now and then a Python scalar
    arity: int = 1
    probe: dict[str, Any] = field(default_factory=dict)  # keywords to ask about dtypes with
    # the second operand's values made at least 0 (the shifts: the standard defines none else)
    nonnegative: bool = False
    # array-api-strict's answer made the standard's where it keeps numpy's and the standard
    # says otherwise (``standard(inputs, expected)``, inputs as drawn)
    standard: Callable[[list[Any], np.ndarray], np.ndarray] | None = None


def infinite_by_finite(a: Any, b: Any) -> np.ndarray:
    """Where an infinity meets a finite number other than 0 (floor_divide's special cases)."""
    return np.isinf(a) & np.isfinite(b) & (np.asarray(b) != 0)


def axis_of(shape: tuple[int, ...], none: bool = True) -> st.SearchStrategy[Any]:
    axes = st.integers(-len(shape), len(shape) - 1) if shape else st.nothing()
    return st.one_of(st.none(), axes) if none else axes


def reduce_keywords(shape: tuple[int, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"axis": axis_of(shape), "keepdims": st.booleans()})


def along(shape: tuple[int, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"axis": axis_of(shape, none=False)})


CASES: dict[str, Case] = {
    **{name: Case(lambda ns, x, name=name: getattr(ns, name)(x))
       for name in (*UNARY, "round")},
    "sign": Case(lambda ns, x: ns.sign(x), standard=lambda inputs, expected: np.where(
        expected == 0, 0, expected).astype(expected.dtype)),  # (+0 + 0j, not -0)
    "expm1": Case(lambda ns, x: ns.expm1(x), standard=lambda inputs, expected: expected if
                  expected.dtype.kind != "c" else (np.where(np.isfinite(inputs[0]), expected,
                  np.exp(inputs[0]) - 1) + np.asarray(complex(0.0, -0.0), expected.dtype))),
    "floor_divide": Case(lambda ns, a, b: ns.floor_divide(a, b), "broadcast", scalars=True,
                         arity=2, standard=lambda inputs, expected: expected if
                         expected.dtype.kind != "f" else np.where(
                             infinite_by_finite(*inputs) | infinite_by_finite(*inputs[::-1]),
                             np.divide(*inputs), expected).astype(expected.dtype)),
    **{name: Case(lambda ns, a, b, name=name: getattr(ns, name)(a, b), "broadcast",
                  scalars=True, arity=2, nonnegative="shift" in name) for name in BINARY},
    "clip": Case(lambda ns, x, lo, hi: ns.clip(x, lo, hi), probe={"lo": 0, "hi": 1},
                 keywords=lambda shape: st.fixed_dictionaries({
                     "lo": st.sampled_from([None, -1, 0]), "hi": st.sampled_from([None, 1, 5])})),
    "where": Case(lambda ns, a, b: ns.where(a > b, a, b), "broadcast", arity=2),
    "astype": Case(lambda ns, x, to: ns.astype(x, getattr(ns, to)), probe={"to": "float64"},
                   keywords=lambda shape: st.fixed_dictionaries({"to": st.sampled_from(
                       ["bool", "int8", "uint16", "int64", "float32", "float64",
                        "complex128"])})),
    **{name: Case(lambda ns, x, name=name, **kw: getattr(ns, name)(x, **kw),
                  keywords=reduce_keywords, rounding=name in ("mean",))
       for name in ("sum", "prod", "mean", "max", "min", "all", "any", "count_nonzero")},
    **{name: Case(lambda ns, x, name=name, **kw: getattr(ns, name)(x, **kw), rounding=True,
                  keywords=lambda shape: st.fixed_dictionaries({
                      "axis": axis_of(shape), "keepdims": st.booleans(),
                      "correction": st.sampled_from([0, 1])})) for name in ("std", "var")},
    **{name: Case(lambda ns, x, name=name, **kw: getattr(ns, name)(x, **kw), "nonscalar",
                  keywords=lambda shape: st.fixed_dictionaries({
                      "axis": axis_of(shape, none=len(shape) == 1)}))
       for name in ("argmax", "argmin")},
    **{name: Case(lambda ns, x, name=name, **kw: getattr(ns, name)(x, **kw), "nonscalar",
                  keywords=lambda shape: st.fixed_dictionaries({
                      "axis": axis_of(shape, none=False), "include_initial": st.booleans()}),
                  probe={"axis": 0}) for name in ("cumulative_sum", "cumulative_prod")},
    **{name: Case(lambda ns, x, name=name, **kw: getattr(ns, name)(x, **kw), "nonscalar",
                  keywords=lambda shape: st.fixed_dictionaries({
                      "axis": axis_of(shape, none=False), "descending": st.booleans()}))
       for name in ("sort", "argsort")},
    **{name: Case(lambda ns, x, name=name: getattr(ns, name)(x))
       for name in ("unique_all", "unique_counts", "unique_inverse", "unique_values")},
    "nonzero": Case(lambda ns, x: ns.nonzero(x), "nonscalar"),
    "flip": Case(lambda ns, x, **kw: ns.flip(x, **kw),
                 keywords=lambda shape: st.fixed_dictionaries({"axis": axis_of(shape)})),
    "roll": Case(lambda ns, x, **kw: ns.roll(x, **kw), "nonscalar",
                 keywords=lambda shape: st.fixed_dictionaries({
                     "shift": st.integers(-3, 3), "axis": axis_of(shape)}),
                 probe={"shift": 1}),
    "diff": Case(lambda ns, x, **kw: ns.diff(x, **kw), "nonscalar",
                 keywords=lambda shape: st.fixed_dictionaries({
                     "axis": axis_of(shape, none=False), "n": st.integers(0, 2)})),
    "expand_dims": Case(lambda ns, x, axis: ns.expand_dims(x, axis=axis),
                        keywords=lambda shape: st.fixed_dictionaries({
                            "axis": st.integers(-len(shape) - 1, len(shape))}),
                        probe={"axis": 0}),
    "permute_dims": Case(lambda ns, x, axes: ns.permute_dims(x, axes),
                         keywords=lambda shape: st.fixed_dictionaries({
                             "axes": st.permutations(range(len(shape))).map(tuple)}),
                         probe={"axes": (1, 0)}),
    "reshape": Case(lambda ns, x: ns.reshape(x, (-1,))),
    "tile": Case(lambda ns, x, reps: ns.tile(x, reps), probe={"reps": (2,)},
                 keywords=lambda shape: st.fixed_dictionaries({
                     "reps": st.lists(st.integers(0, 2), max_size=3).map(tuple)})),
    "repeat": Case(lambda ns, x, repeats, **kw: ns.repeat(x, repeats, **kw), "nonscalar",
                   keywords=lambda shape: st.fixed_dictionaries({
                       "repeats": st.integers(0, 2), "axis": axis_of(shape)}),
                   probe={"repeats": 2}),
    "unstack": Case(lambda ns, x, **kw: ns.unstack(x, **kw), "nonscalar", keywords=along,
                    probe={"axis": 0}),
    "broadcast_arrays": Case(lambda ns, a, b: ns.broadcast_arrays(a, b), "broadcast", arity=2),
    "concat": Case(lambda ns, a, b, **kw: ns.concat([a, b], **kw), "same", arity=2,
                   keywords=lambda shape: st.fixed_dictionaries({"axis": axis_of(shape)})),
    "stack": Case(lambda ns, a, b, **kw: ns.stack([a, b], **kw), "same", arity=2,
                  keywords=lambda shape: st.fixed_dictionaries({
                      "axis": st.integers(-len(shape) - 1, len(shape))})),
    "take": Case(lambda ns, x, **kw: ns.take(x, ns.asarray([0, -1, 0]), **kw), "positive",
                 keywords=along, probe={"axis": 0}),
    "take_along_axis": Case(lambda ns, x, **kw: ns.take_along_axis(
        x, ns.argsort(x, axis=kw["axis"]), **kw), "positive", keywords=along,
        probe={"axis": 0}),
    "searchsorted": Case(lambda ns, a, b, **kw: ns.searchsorted(ns.sort(a), b, **kw), "vectors",
                         arity=2, keywords=lambda shape: st.fixed_dictionaries(
                             {"side": st.sampled_from(["left", "right"])})),
    "matmul": Case(lambda ns, a, b: ns.matmul(a, b), "matmul", arity=2, rounding=True),
    "tensordot": Case(lambda ns, a, b: ns.tensordot(a, b, axes=1), "matmul", arity=2,
                      rounding=True),
    "vecdot": Case(lambda ns, a, b: ns.vecdot(a, b), "same", arity=2, rounding=True),
    "matrix_transpose": Case(lambda ns, x: ns.matrix_transpose(x), "matrix"),
    "tril": Case(lambda ns, x, k: ns.tril(x, k=k), "matrix", probe={"k": 0},
                 keywords=lambda shape: st.fixed_dictionaries({"k": st.integers(-2, 2)})),
    "triu": Case(lambda ns, x, k: ns.triu(x, k=k), "matrix", probe={"k": 0},
                 keywords=lambda shape: st.fixed_dictionaries({"k": st.integers(-2, 2)})),
    "zeros_like": Case(lambda ns, x: ns.zeros_like(x)),
    "ones_like": Case(lambda ns, x: ns.ones_like(x)),
    "full_like": Case(lambda ns, x: ns.full_like(x, 1)),
    "linalg.det": Case(lambda ns, x: ns.linalg.det(x), "square", rounding=True),
    "linalg.inv": Case(lambda ns, x: ns.linalg.inv(x), "square", rounding=True),
    "linalg.solve": Case(lambda ns, a, b: ns.linalg.solve(a, b), "solve", arity=2,
                         rounding=True),
    "linalg.eigvalsh": Case(lambda ns, x: ns.linalg.eigvalsh(x + ns.matrix_transpose(x)),
                            "square", rounding=True),
    "linalg.qr": Case(lambda ns, x, **kw: ns.linalg.qr(x, **kw), "matrix", rounding=True,
                      keywords=lambda shape: st.fixed_dictionaries({
                          "mode": st.sampled_from(["reduced", "complete"])})),
    "linalg.slogdet": Case(lambda ns, x: ns.linalg.slogdet(x), "square", rounding=True),
    "linalg.pinv": Case(lambda ns, x: ns.linalg.pinv(x), "matrix", rounding=True),
    "repeat counts": Case(lambda ns, x, **kw: ns.repeat(x, ns.asarray([2, 0, 1, 3])[
        :x.shape[0]], axis=0), "positive"),
    **{f"fft.{name}": Case(lambda ns, x, name=name, **kw: getattr(ns.fft, name)(x, **kw),
                           "positive", rounding=True, keywords=lambda shape: st.fixed_dictionaries(
                               {"norm": st.sampled_from(["backward", "ortho", "forward"])}))
       for name in ("fft", "ifft", "fftn", "ifftn", "rfft", "rfftn", "hfft", "ihfft")},
    **{f"fft.{name}": Case(lambda ns, x, name=name, **kw: getattr(ns.fft, name)(x, **kw),
                           "positive", rounding=True, keywords=lambda shape: st.fixed_dictionaries(
                               {"n": st.integers(1, 6), "axis": axis_of(shape, none=False)}),
                           probe={"n": 2, "axis": 0})
       for name in ("irfft", "rfft")},
    **{f"fft.{name}": Case(lambda ns, x, name=name, **kw: getattr(ns.fft, name)(x, **kw),
                           "nonscalar", keywords=lambda shape: st.fixed_dictionaries({
                               "axes": st.one_of(st.none(), st.lists(
                                   axis_of(shape, none=False), unique=True,
                                   max_size=len(shape)))}))
       for name in ("fftshift", "ifftshift")},
    "fft.fftfreq": Case(lambda ns, x: ns.fft.fftfreq(x.shape[0] + 1, d=0.25)),
    "fft.rfftfreq": Case(lambda ns, x: ns.fft.rfftfreq(x.shape[0] + 1, d=2.0)),
    "linalg.svdvals": Case(lambda ns, x: ns.linalg.svdvals(x), "matrix", rounding=True),
    "linalg.vector_norm": Case(lambda ns, x, **kw: ns.linalg.vector_norm(x, **kw),
                               rounding=True, keywords=lambda shape: st.fixed_dictionaries({
                                   "axis": axis_of(shape), "keepdims": st.booleans(),
                                   "ord": st.sampled_from([1, 2, 3, np.inf, -np.inf])})),
    "linalg.matrix_norm": Case(lambda ns, x, **kw: ns.linalg.matrix_norm(x, **kw), "matrix",
                               rounding=True, keywords=lambda shape: st.fixed_dictionaries({
                                   "keepdims": st.booleans(),
                                   "ord": st.sampled_from(["fro", 1, np.inf, -1])})),
    "linalg.trace": Case(lambda ns, x, offset: ns.linalg.trace(x, offset=offset), "matrix",
                         probe={"offset": 0},
                         keywords=lambda shape: st.fixed_dictionaries({
                             "offset": st.integers(-2, 2)})),
    "linalg.diagonal": Case(lambda ns, x, offset: ns.linalg.diagonal(x, offset=offset),
                            "matrix", probe={"offset": 0},
                            keywords=lambda shape: st.fixed_dictionaries({
                                "offset": st.integers(-2, 2)})),
    "linalg.outer": Case(lambda ns, a, b: ns.linalg.outer(a, b), "vectors", arity=2),
    "linalg.cross": Case(lambda ns, a, b: ns.linalg.cross(a, b), "cross", arity=2),
    "linalg.matrix_power": Case(lambda ns, x, n: ns.linalg.matrix_power(x, n), "square",
                                rounding=True, probe={"n": 2},
                                keywords=lambda shape: st.fixed_dictionaries(
                                    {"n": st.integers(0, 3)})),
}

# Shapes of small sides (0 to 4), at most 3 axes
SIDES = {"min_side": 0, "max_side": 4}


def shapes_for(kind: str) -> st.SearchStrategy[list[tuple[int, ...]]]:
    """The input shapes of a case's kind."""
    one = {"any": hnp.array_shapes(min_dims=0, max_dims=3, **SIDES),
           "nonscalar": hnp.array_shapes(min_dims=1, max_dims=3, **SIDES),
           "positive": hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
           "matrix": hnp.array_shapes(min_dims=2, max_dims=3, **SIDES)}
    if kind in one:
        return one[kind].map(lambda shape: [shape])
    if kind == "broadcast":
        return hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, **SIDES).map(
            lambda found: list(found.input_shapes))
    if kind == "same":
        return hnp.array_shapes(min_dims=1, max_dims=3, **SIDES).map(lambda s: [s, s])
    if kind == "vectors":
        return st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda n: [(n[0],), (n[1],)])
    if kind == "cross":
        return st.sampled_from([[(3,), (3,)], [(2, 3), (3,)], [(1, 3), (4, 3)]])
    batch = st.sampled_from([(), (2,)])
    if kind == "square":
        return st.tuples(batch, st.integers(1, 3)).map(lambda b: [b[0] + (b[1], b[1])])
    if kind == "solve":
        return st.tuples(batch, st.integers(1, 3), st.integers(1, 2)).map(
            lambda b: [b[0] + (b[1], b[1]), b[0] + (b[1], b[2])])
    assert kind == "matmul"
    return st.tuples(batch, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)).map(
        lambda b: [b[0] + (b[1], b[2]), (b[2], b[3])])


def probe_shapes(kind: str) -> list[tuple[int, ...]]:
    """Shapes every case of ``kind`` takes, to ask array-api-strict which dtypes it takes."""
    return {"matmul": [(2, 2), (2, 2)], "solve": [(2, 2), (2, 1)], "vectors": [(2,), (2,)],
            "cross": [(3,), (3,)]}.get(kind, [(2, 2), (2, 2)])


def dtypes_taken(case: Case) -> list[tuple[str, ...]]:
    """The dtypes (pairs, for two arrays) array-api-strict takes for ``case``: the standard's
    own (its promotion table, for pairs)."""
    shapes = probe_shapes(case.shapes)
    taken = []
    for dtypes in (((d,) for d in DTYPES) if case.arity == 1 else
                   ((a, b) for a in DTYPES for b in DTYPES)):
        inputs = [array_api_strict.asarray(  # (invertible matrices, for linalg)
            np.eye(*s) if len(s) == 2 else np.ones(s), dtype=getattr(array_api_strict, d))
            for s, d in zip(shapes, dtypes)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                case.call(array_api_strict, *inputs, **case.probe)
        except Exception:  # (refused: not drawn)
            continue
        taken.append(dtypes)
    return taken


def values(dtype: str, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    """Arrays of ``dtype``: NaN, infinities, signed zeros, integer extremes included."""
    return hnp.arrays(np.dtype(dtype), shape)


def scalar_like(dtype: str) -> st.SearchStrategy[Any]:
    """A Python scalar of the kind the standard lets meet an array of ``dtype``."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return st.booleans()
    if kind in "iu":
        info = np.iinfo(dtype)
        return st.integers(max(int(info.min), -100), min(int(info.max), 100))
    if kind == "f":
        return st.floats(width=32 if dtype == "float32" else 64)
    return st.complex_numbers(width=64 if dtype == "complex64" else 128)


def as_numpy(result: Any) -> Any:
    """A result of array-api-strict (an array, or a tuple or list of them) as numpy's."""
    if isinstance(result, (tuple, list)):
        return [as_numpy(r) for r in result]
    return np.asarray(result)


def read(result: Any) -> Any:
    """A result of fabric.array_api, read (every part of a tuple or list)."""
    if isinstance(result, (tuple, list)):
        return [read(r) for r in result]
    return result.numpy()


def assert_same(found: Any, expected: Any, rounding: bool) -> None:
    """Same dtype, shape and values (NaN where NaN, zeros of the same sign; within rounding
    where the case allows it)."""
    if isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected)
        for f, e in zip(found, expected):
            assert_same(f, e, rounding)
        return
    assert found.dtype == expected.dtype, (found.dtype, expected.dtype)
    assert found.shape == expected.shape, (found.shape, expected.shape)
    if expected.dtype.kind in "fc" and rounding:
        tolerance = 1e-4 if expected.dtype in (np.float32, np.complex64) else 1e-10
        finite = np.isfinite(expected)
        scale = max(1.0, float(np.abs(expected[finite]).max())) if finite.any() else 1.0
        # (rounding is the largest's; where a sum in another order overflows, inf and inf*0
        # fall where the order puts them: an element numpy found not finite is not compared)
        np.testing.assert_allclose(found[finite], expected[finite], rtol=tolerance,
                                   atol=tolerance * scale)
        return
    np.testing.assert_array_equal(found, expected)
    if expected.dtype.kind in "fc":
        for part in (np.real, np.imag):
            zeros = part(expected) == 0
            np.testing.assert_array_equal(np.signbit(part(found))[zeros],
                                          np.signbit(part(expected))[zeros])


@pytest.fixture(scope="module")
def xp(shared_cluster):
    with shared_cluster.connect(device=0) as session:
        yield session.asarray([0]).__array_namespace__()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_namespace_agrees_with_array_api_strict(xp: Any, name: str) -> None:
    case = CASES[name]
    taken = dtypes_taken(case)
    assert taken, f"array-api-strict takes no dtype for {name}"

    @st.composite
    def example(draw: Any) -> tuple[list[Any], dict[str, Any]]:
        dtypes = draw(st.sampled_from(taken))
        shapes = draw(shapes_for(case.shapes))
        if case.arity == 1:
            shapes = shapes[:1]
        arrays: list[Any] = [draw(values(d, s)) for d, s in zip(dtypes, shapes)]
        if case.scalars and draw(st.integers(0, 3)) == 0:
            arrays[1] = draw(scalar_like(dtypes[0]))
        if case.nonnegative:
            arrays[1] = np.where(arrays[1] < 0, 0, arrays[1]) if isinstance(
                arrays[1], np.ndarray) else abs(arrays[1])
        return arrays, draw(case.keywords(shapes[0]))

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large])
    @given(example())
    def agrees(drawn: tuple[list[Any], dict[str, Any]]) -> None:
        arrays, keywords = drawn
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                expected = as_numpy(case.call(array_api_strict, *[
                    array_api_strict.asarray(a) if isinstance(a, np.ndarray) else a
                    for a in arrays], **keywords))
            except Exception:  # (refused: fabric refuses too, at the call or the read)
                with pytest.raises(Exception):
                    read(case.call(xp, *[xp.asarray(a) if isinstance(a, np.ndarray) else a
                                         for a in arrays], **keywords))
                return
            if case.standard is not None:
                expected = case.standard(arrays, expected)
            found = read(case.call(xp, *[xp.asarray(a) if isinstance(a, np.ndarray) else a
                                         for a in arrays], **keywords))
        assert_same(found, expected, case.rounding)

    agrees()
