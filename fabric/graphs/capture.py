"""The capture device: record the ops a session issues, as a trace to print, save and replay.

Rule: a capture never changes what the session does; it only keeps a copy of each op as it
is queued (uploads with their bytes). A worker cannot host a capture device: capturing
happens here, on the client, around a real session.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgpack
import numpy as np

from fabric.arrays.creation import ArrayNamespace
from fabric.arrays.origins import issued_at
from fabric.arrays.tensor import Tensor
from fabric.core.ops import Spec, shape_from_device
from fabric.core.wire import decode_scalar


@dataclass
class Trace:
    """The ops issued through a session while it was captured, in order."""

    ops: list[dict[str, Any]] = field(default_factory=list)

    def record(self, op: Sequence[Any], buffer: Any, result: Spec | None) -> None:
        """Keep a copy of one queued op (the session's stream calls this: a trace is one of
        its sinks)."""
        name, out, args, params = op
        entry: dict[str, Any] = {"op": name, "out": out, "args": list(args),
                                 "params": dict(params)}
        if result is not None:
            entry["shape"], entry["dtype"] = list(result.shape), result.dtype.str
        if buffer is not None:
            entry["data"] = bytes(buffer)
            entry["params"].pop("buffer", None)
        self.ops.append(entry)

    @property
    def inputs(self) -> list[int]:
        """Ids of tensors the trace reads but did not create, in order of first use."""
        made: set[int] = set()
        needed: list[int] = []
        for entry in self.ops:
            for arg in entry["args"]:
                if type(arg) is int and arg not in made and arg not in needed:
                    needed.append(arg)
            made.add(entry["out"])
        return needed

    def __str__(self) -> str:
        lines = []
        for entry in self.ops:
            args = ", ".join(f"t{a}" if type(a) is int else repr(decode_scalar(a))
                             for a in entry["args"])
            params = ", ".join(f"{k}={v!r}" for k, v in entry["params"].items())
            call = f"{entry['op']}({', '.join(p for p in (args, params) if p)})"
            result = (f"t{entry['out']} = " if "shape" in entry else "")
            kind = f"  # {tuple(entry['shape'])} {np.dtype(entry['dtype'])}" \
                if "shape" in entry else ""
            lines.append(f"{result}{call}{kind}")
        return "\n".join(lines)

    def save(self, path: str | Path) -> None:
        """Write the trace to ``path`` as one msgpack map, ``{"version": 1, "ops": [...]}``:
        each op a map of its name (``op``), its result's id (``out``), ``args`` (tensor ids,
        and scalars as the wire encodes them), ``params``, the result's ``shape`` and
        ``dtype`` (numpy's ``dtype.str``), and an upload's bytes (``data``). ``Trace.load``
        reads it back."""
        Path(path).write_bytes(msgpack.packb({"version": 1, "ops": self.ops}, use_bin_type=True))

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace written by ``save``."""
        try:
            data = msgpack.unpackb(Path(path).read_bytes(), raw=False)
        except ValueError:  # msgpack's errors for bad input are ValueErrors
            data = None
        if not isinstance(data, dict) or data.get("version") != 1:
            raise ValueError(f"{path} is not a fabric trace.")
        return cls(list(data["ops"]))

    def replay(self, session: ArrayNamespace, *inputs: Tensor | np.ndarray) -> dict[int, Tensor]:
        """Issue the trace's ops on ``session``; returns a dict from each recorded tensor's
        id (``t.id`` when captured, the ``tN`` that printing the trace shows) to the tensor
        that replaying made on ``session``, for the inputs too.

        ``inputs`` bind, in order, the tensors the trace read but did not create
        (``trace.inputs``): tensors of ``session``, or numpy arrays, which are uploaded.
        """
        graphs = sorted({e["op"] for e in self.ops if e["op"].startswith("graph_")})
        if graphs:
            raise TypeError(f"This trace holds {', '.join(graphs)} ops of a fabric.function, "
                            "which replay cannot rebuild: capture the function's eager code "
                            "instead (call it undecorated).")
        if len(inputs) != len(self.inputs):
            raise TypeError(f"This trace reads {len(self.inputs)} tensor(s) it did not "
                            f"create; pass them to replay() (got {len(inputs)}).")
        tensors: dict[int, Tensor] = dict(zip(self.inputs, map(session.asarray, inputs)))
        origin = issued_at()  # errors of replayed ops name the replay's line
        for entry in self.ops:
            name, params = entry["op"], entry["params"]
            if name == "put":
                array = np.frombuffer(entry["data"], params["dtype"]).reshape(params["shape"])
                tensors[entry["out"]] = session.asarray(array)
            elif "shape" not in entry:  # an op with no result (seed)
                session.stream.enqueue([name, 0, entry["args"], params])
            else:
                args = [tensors[a] if type(a) is int else decode_scalar(a)
                        for a in entry["args"]]
                shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
                tensors[entry["out"]] = made = session.emit(name, args, shape, dtype, params,
                                                            origin)
                if shape_from_device(name, args):  # (recorded before it was known)
                    session.resolve_shape(made)
        return tensors


@contextlib.contextmanager
def capture(session: ArrayNamespace) -> Iterator[Trace]:
    """Record every op issued through ``session`` inside the ``with`` block as a Trace."""
    trace = Trace()
    session.stream.sinks.append(trace)
    try:
        yield trace
    finally:
        session.stream.sinks.remove(trace)
