"""Writes docs/ops.md, the page of what runs on a device, from the op table and the registries
that reach it: ``python docs/ops_page.py`` (``tests/unit/test_ops_page.py`` fails while the
committed page differs from what this makes).

Rule: nothing on the page is typed by hand that the code can say: the numpy functions tensors
and sharded tensors take are their handler registries' keys, each op's backends are what each
backend's device would run (``Op.runs_on``, the jax and cupy devices' own spellings, the
numexpr and cupy devices' fused ops), and its notes are the table's sets. CuPy needs a GPU
and is not installed where the page is made: the names its module has are read from
``cupy_names.txt``, which ``python docs/ops_page.py --record-cupy`` writes where it is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable

import jax.numpy as jnp
import numpy as np

import fabric.arrays.creation  # noqa: F401  (registers numpy's functions on tensors)
import fabric.mesh.device_mesh  # noqa: F401  (registers numpy's statistics on sharded ones)
from fabric.arrays.tensor import ARRAY_FUNCTIONS, numpy_name
from fabric.core.ops import (DATA_DEPENDENT_DTYPE, DATA_DEPENDENT_OPS, OPS, RANDOM_OPS,
                             WRITES_IN_PLACE)
from fabric.mesh.reductions import REDUCTIONS as COMBINED
from fabric.mesh.sharded import FUNCTIONS as SHARDED
from fabric.workers.backends.cupy_ops import ON_HOST, fusable_ops, spelled
from fabric.workers.backends.jax_ops import NEEDS_DATA, SPELLED
from fabric.workers.backends.numexpr_rules import fused_ops

PAGE = Path(__file__).resolve().parent / "ops.md"
CUPY_NAMES = Path(__file__).resolve().parent / "cupy_names.txt"

INTRO = """\
# What runs on a device

This page is generated from the op table (`fabric.core.ops.OPS`) and the registries of
numpy's functions on tensors: `python docs/ops_page.py` writes it, and
`tests/unit/test_ops_page.py` fails while it is stale. How the ops behave (shapes and dtypes
known at the call, errors that depend on the values raised at the next read, reads) is
[the user's guide](using.md#what-runs-on-the-device).

A numpy function or method that is not listed here raises `TypeError` at the call, naming
it, and nothing is downloaded: read the tensor with `t.numpy()` first to compute locally.
"""


OUTSIDE = """\
## What does not run on a device

Besides the functions not listed above, some forms of listed ones are refused at the call
with a sentence that says what to do instead: a rule's name for `np.histogram`'s bins
(`bins="auto"`: give a count or edges), `np.linalg.qr`'s mode `"raw"`, `out=` of
`np.median`, the quantiles, `np.take` and `np.fft` (the reductions' and the ufuncs' `out=`
take a tensor), `np.percentile`'s `weights=`, `np.cov`'s `fweights=` and `aweights=`, `np.pad`
with a function as its mode, `np.einsum` with lists of axes, `ufunc.outer` and
`ufunc.reduceat`. `np.fft.fftfreq` and `rfftfreq` take no array, so numpy cannot hand them to
fabric: the array API namespace's `xp.fft.fftfreq` makes them on a device. `np.lexsort` takes
its keys as a tuple or a tensor: numpy makes a list of tensors one array, which reads them.
"""


def _names(functions: Iterable[Any]) -> list[str]:
    return _quoted(numpy_name(function).removeprefix("numpy.") for function in functions)


def _quoted(names: Iterable[str]) -> list[str]:
    return [f"`{name}`" for name in sorted(set(names))]


def _listed(names: list[str]) -> str:
    """Names as one paragraph, wrapped at 99 characters."""
    lines, line = [], ""
    for name in names:
        piece = f"{name}, " if name != names[-1] else f"{name}."
        if len(line) + len(piece) > 99:
            lines.append(line.rstrip())
            line = ""
        line += piece
    return "\n".join([*lines, line])


def _jax(name: str) -> str:
    if name in SPELLED:
        return "restated"
    return "jax.numpy" if OPS[name].runs_on(jnp) else "no"


class RecordedCupy:
    """CuPy's module as far as the op table asks it (which functions it has), from the names
    ``record_cupy`` wrote."""

    __name__ = "cupy"

    def __init__(self, path: Path) -> None:
        lines = path.read_text().splitlines()
        self.version = lines[0].split()[-1]
        self.names = frozenset(lines[1:])

    def __getattr__(self, name: str) -> Any:
        if name in self.names:
            return self.__init__  # (any callable: only its presence is asked)
        raise AttributeError(name)


def record_cupy() -> None:
    """Write ``CUPY_NAMES``: the installed CuPy's version, then its callables' names."""
    import cupy
    names = sorted(name for name in dir(cupy) if callable(getattr(cupy, name)))
    CUPY_NAMES.write_text("\n".join([f"# CuPy {cupy.__version__}", *names]) + "\n")


def _cupy(name: str, recorded: RecordedCupy) -> str:
    if name in ON_HOST:
        return "host copy"
    if name in spelled(np, np.asarray):
        return "restated"
    if name in fusable_ops(recorded):
        return "fused"
    return "cupy" if OPS[name].runs_on(recorded) else "no"


def _notes(name: str) -> str:
    notes = []
    if name in DATA_DEPENDENT_OPS:
        notes.append("shape from the device")
    if name in DATA_DEPENDENT_DTYPE:
        notes.append("dtype from the device")
    if name in RANDOM_OPS:
        notes.append("the session's generator")
    if name in WRITES_IN_PLACE:
        notes.append("an update")
    if name in NEEDS_DATA or name in DATA_DEPENDENT_OPS or name in RANDOM_OPS:
        notes.append("op by op in a jax graph")
    return "; ".join(notes)


def page() -> str:
    """The page's text."""
    fused = set(fused_ops())
    cupy = RecordedCupy(CUPY_NAMES)
    ufuncs = _quoted(name for name, op in OPS.items() if isinstance(op.impl, np.ufunc))
    rows = [f"| `{name}` | yes | {'fused' if name in fused else 'numpy'} | {_jax(name)} | "
            f"{_cupy(name, cupy)} | {_notes(name)} |" for name in sorted(OPS)]
    combined = _quoted(COMBINED)
    return "\n".join([
        INTRO,
        "## numpy's functions on tensors",
        "",
        _listed(_names(ARRAY_FUNCTIONS)),
        "",
        "numpy's ufuncs of the op table (below) run as `np.<ufunc>(t, ...)`, with `out=` a "
        "tensor, and\n`.at`; those of two operands also as `.reduce` (`axis=`, `keepdims=`, "
        "`initial=`, `where=`)\nand `.accumulate`:",
        _listed(ufuncs),
        "",
        "## numpy's functions on sharded tensors",
        "",
        _listed(_names(SHARDED)),
        "",
        "Elementwise ufuncs run on each shard. These reductions combine across the split "
        "axis (each\nshard's partial results, combined when read), as do `np.average` and "
        "the ufuncs' `.reduce`\nwhere it is one of them:",
        _listed(combined),
        "",
        "The contractions `matmul` (`@`), `dot`, `einsum`, `tensordot` and `cov` run on each "
        "shard where\nthey keep the split axis; where they sum over it (`Z.T @ Z`, "
        "`np.cov(Z, rowvar=False)` of a\nrow split), each device's product of its block is "
        "summed when read.",
        "",
        "The others run on each shard along the other axes; across the split axis they are "
        "refused,\nnaming the reshard after which they run. A function not listed names a "
        "copy of the whole\narray on one device that takes it (`x.reshard(axis=None)."
        "shards[0][1]`).",
        "",
        "## The op table, per backend",
        "",
        "Every op runs on a numpy device. A numexpr device fuses chains of the ops marked "
        "*fused* into\none numexpr evaluation and runs the others as numpy does. A jax "
        "device runs an op as\n`jax.numpy` spells it, or *restated* where `jax.numpy` "
        "computes otherwise than numpy (its\ndtypes and numpy's errors on the values are "
        "kept); a dtype XLA cannot hold (`float128`), or a\nresult whose dtype jax would "
        "make otherwise, is refused with a sentence.",
        "",
        "A cupy device runs an op as CuPy spells it: *fused* where a graph's runs of such "
        "ops (and\nbatches seen again) become one `cupy.fuse` kernel; *restated* where CuPy "
        "computes otherwise\nthan numpy (an index out of bounds, a float converted to an "
        "integer, an integer to a negative\npower: numpy's values and errors are kept); or as "
        "numpy's own function on a *host copy* of its\ninputs, moved back, where CuPy has "
        f"none or accumulates otherwise. CuPy's names are {cupy.version}'s.",
        "",
        "| op | numpy | numexpr | jax | cupy | notes |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        OUTSIDE,
    ])


if __name__ == "__main__":
    if sys.argv[1:] == ["--record-cupy"]:
        record_cupy()
        sys.stdout.write(f"wrote {CUPY_NAMES}\n")
    else:
        PAGE.write_text(page())
        sys.stdout.write(f"wrote {PAGE}\n")
