"""The op stream's wire format, sans I/O: what a SUBMIT's ops, a graph's ops and an array's
frames look like, encoded on the client and decoded on the worker.

Rule: every rule about how values travel inside a data message's body lives here, beside
``fabric.core.protocol`` (which owns the frames and the header). Client and worker both import
this module; it imports neither.

A SUBMIT's body is ``{"ops": [entry, ...]}``, run in order. An entry is either

- a bare int: the id of a tensor the client let go, freed at that point of the stream,
- ``[name, out, args, params]`` (``OpEntry``): op ``name`` of the op table (``fabric.core.ops``) or
  a session op (``SESSION_OPS``), making tensor ``out`` (a client-allocated id) from ``args``,
  or
- ``[out, name, *args]``, the same op without params in its compact form (told apart by its
  first item, an int): the stream's commonest entry, an elementwise op, packs in two thirds of
  the time without the list of args and the empty map (protocol version 3).

An arg is a tensor id (an int) or a scalar: a float, a bool or None as it is, ``[value]`` for
a Python int and ``[value, dtype]`` for a numpy scalar (``encode_scalar``). Params are
msgpack values (``encode_param``): an index as ``pack_index`` makes it, ``encode_index``'s
items packed as one bytes (or those items as they are; its arrays are the op's args after the
target and the values), an axis tuple as a list, a dtype as a device dtype's ``str``.
``put`` carries its array as the message's buffer number ``params["buffer"]``, with ``dtype``
and ``shape``; a read's reply carries the bytes as its one buffer (``array_from_frame``).

Shared memory (``fabric.core.shm``), for arrays of at least ``THRESHOLD_BYTES`` between a client
and a worker on one host: a slot travels as ``[segment name, offset, nbytes]``
(``decode_segment_ref``). A ``put`` carries ``"shm": slot`` in place of ``"buffer"``; a
``read_into`` request is a read whose bytes the worker writes into the slot ``"into"``,
answered by an empty body; a ``shm_slot`` request (``{"nbytes"}``, and optionally
``"give_back"``: slots it offered the session earlier, unused, for its pool, and ``"start":
True``: the session's start slot, which a device lends a bounded number of) is answered
``{"slot": slot}``, a slot of the device's own segments that the next ``put`` naming its start
keeps (with the put's own bytes, at most the slot's), or ``{"slot": None}``; one without
ops batched in it runs ahead of its session's queued messages. A ``read_into`` with ``"view":
True`` may be answered ``{"pinned": slot}`` instead, unwritten: the device's own slot where the
tensor lies, pinned for the client to map until an ``unpin`` request (``{"slots": [segment
name, ...]}``, once per view) releases it (``workers.pins``).
A session may use them once a ``shm_probe`` request
(``{"boot", "segment", "token"}``: the client's boot id, and a segment holding ``token`` as
its first 8 bytes) was answered ``{"shared_memory": True}``.

Graph ops (``fabric.graphs.function`` traces, ``workers.registered_graphs`` runs), in the same
stream::

    ["graph_register", 0, [], {"graph": id, "name": str, "ops": [entry, ...],
                                "inputs": [[shape, dtype], ...], "outputs": [local ids]}]
    ["graph_call", first_out, [input ids], {"graph": id, "outputs": n}]
    ["graph_free", 0, [], {"graph": id}]

Inside a graph, ids are local: ``1..len(inputs)`` are the inputs, then one id per op; a
call's outputs are the ids ``first_out .. first_out + n - 1``. Each session holds at most
``GRAPH_CACHE_SIZE`` graphs on its worker, each of at most ``MAX_GRAPH_OPS`` ops.

A REPLY's body may carry the floating-point warnings of the session's ops since the last
reply (``DeviceWarning``): ``"warnings": [[message, tensor, graph, graph_op], ...]``, at most
``MAX_WARNINGS`` distinct ones, and ``"warnings_dropped"``: how many more were left out.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import msgpack
import numpy as np

from fabric.core.errors import ProtocolError, named
from fabric.core.op_indexing import IndexArray
from fabric.core.ops import INDEXED_OPS, NO_PARAMS
from fabric.core.shm import SegmentName, parse_name

GRAPH_CACHE_SIZE = 64  # graphs a session holds on its worker (the client mirrors the bound)
# Ops one graph may hold: its registration compiles them into one Python function, a call that
# holds the GIL throughout (about 30 us an op on one quiet core here, 0.3 s for this many, and
# several times that on a loaded one); the client refuses a longer trace, the worker a longer
# registration, each naming the bound.
MAX_GRAPH_OPS = 10_000
GRAPH_OPS = ("graph_register", "graph_call", "graph_free")
# ops that act on the session, not the op table's
SESSION_OPS = ("seed", "send", "release", *GRAPH_OPS)
INT_RANGE = (-2**63, 2**64)  # the ints that travel as ints (msgpack's)
MAX_WARNINGS = 64  # distinct device warnings one reply carries; more are only counted
PACKED_INDEX_BYTES = 512  # the longest packed index a worker keeps decoded
PACKED_INDEXES_KEPT = 1024  # packed indexes a worker keeps decoded (then it starts afresh)


class OpEntry(NamedTuple):
    """One op of a SUBMIT (or of a graph): what a list ``[name, out, args, params]`` holds."""

    name: str
    out: int
    args: list[Any]
    params: dict[str, Any]


def parse_op(entry: Any) -> OpEntry:
    """An op entry from the wire, in either form, checked for its form (not its op);
    ProtocolError if it has none. (The worker's hot loop unpacks entries inline, with these
    same checks.)"""
    if type(entry) is not list and type(entry) is not tuple:  # (a map's keys would unpack)
        raise ProtocolError(f"Malformed op {entry!r}.")
    try:
        first, second, *rest = entry
        if type(first) is int:  # the compact form: [out, name, *args]
            name, out, args, params = second, first, rest, NO_PARAMS
        else:
            (name, out), (args, params) = (first, second), rest
    except (TypeError, ValueError):
        raise ProtocolError(f"Malformed op {entry!r}.") from None
    if type(out) is not int:  # an id; anything else could not even be poisoned
        raise ProtocolError(f"Malformed op {entry!r}.")
    return OpEntry(name, out, args, params)


def op_entry(name: str, out: int, args: tuple[Any, ...], params: dict[str, Any]
             ) -> tuple[Any, ...]:
    """Op ``name`` making tensor ``out`` as a SUBMIT's entry: compact without params.

    This and ``parse_op`` define the two forms; for speed, these places spell an entry
    inline, or read one by position, instead of calling them. A change to either form
    changes each of them (tests/unit/test_op_entries.py drives every one, and fails on the
    one left behind):

    - made inline, in the compact form: ``fabric.arrays.operators``' short way,
      ``elementwise_pair`` (``(out, name, first, second)``) and ``elementwise_single``
      (``(out, name, operand)``), handed to ``fabric.arrays.stream.OpStream.push``;
    - made inline, in the full form (ops with params): ``fabric.arrays.creation``
      (``ArrayNamespace._put``: a ``put``), ``fabric.transport.bulk._put`` (a ``put`` from
      shared memory), ``fabric.arrays.random`` (``seed``), ``fabric.transport.moves``
      (``send``), ``fabric.graphs.capture`` (``Trace.replay``: an op without a result) and
      ``fabric.graphs.function`` (``trace_function``: ``graph_register``; ``call``:
      ``graph_call`` and ``graph_free``);
    - read by position on the client: ``fabric.arrays.stream.repeat_cut`` (an op's name, out
      and args, in either form); ``OpStream.push`` shows its sinks ``parse_op``'s full
      form, which ``fabric.graphs.function`` (``Tracer.record``: ``op[0]``;
      ``trace_function``: ``op[1]``; ``TracedGraph.op_count``: ``register_op[3]``) and
      ``fabric.graphs.capture`` (``Trace.record``: four items) read;
    - read on the worker: ``workers.executor.Executor._run`` unpacks either form inline,
      with ``parse_op``'s checks; ``workers.registered_graphs.register`` reads a graph's ops
      by position after ``parse_op``'s check, in the full form only (the tracer records no
      other: a compact op in a ``graph_register`` fails to register, not as malformed).
    """
    return (name, out, args, params) if params else (out, name, *args)


class DeviceWarning(NamedTuple):
    """A warning numpy gave on the device: its message, and the op that caused it, named by
    the tensor it made (a graph call's first output) and, inside a graph, the graph's id and
    the op's index in it."""

    message: str
    tensor: int
    graph: int | None = None
    graph_op: int | None = None


def decode_warnings(body: dict[str, Any]) -> tuple[list[DeviceWarning], int]:
    """The device warnings a REPLY body carries, and how many more were left out;
    ProtocolError if they are malformed."""
    entries, dropped = body.get("warnings", []), body.get("warnings_dropped", 0)
    if not isinstance(entries, list) or len(entries) > MAX_WARNINGS or type(dropped) is not int:
        raise ProtocolError(f"A reply's 'warnings' must be a list of at most {MAX_WARNINGS} "
                            "entries, and 'warnings_dropped' an int.")
    found = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4 and type(entry[0]) is str
                and type(entry[1]) is int
                and all(v is None or type(v) is int for v in entry[2:])):
            raise ProtocolError(f"Malformed device warning {entry!r}: it must be "
                                "[message, tensor, graph, graph_op].")
        found.append(DeviceWarning(*entry))
    return found, dropped


def encode_index(index: tuple[Any, ...]) -> list[Any]:
    """An index as msgpack-able items: an int, None, ``"..."``, ``[start, stop, step]`` for a
    slice and ``{"array": n}`` for the op's index array number ``n`` (an ``IndexArray``);
    ``fabric.arrays.indexing`` makes such an index of whatever numpy takes."""
    encoded: list[Any] = []
    for item in index:
        if item is Ellipsis:
            encoded.append("...")
        elif type(item) is slice:
            encoded.append([item.start, item.stop, item.step])
        elif type(item) is IndexArray:
            encoded.append({"array": item.position})
        else:  # an int or None
            encoded.append(item)
    return encoded


def pack_index(index: tuple[Any, ...]) -> bytes:
    """``encode_index``'s items packed as one msgpack bytes: how an index travels, cheaper
    to send than its items, and a key a worker decodes once for the few a loop repeats."""
    return msgpack.packb(encode_index(index))


_packed_indexes: dict[bytes, tuple[Any, ...]] = {}


def decode_index(encoded: Any) -> tuple[Any, ...]:
    """The inverse of ``encode_index`` or ``pack_index``; ProtocolError for anything they do
    not make."""
    if type(encoded) is not bytes:
        return _decode_items(encoded)
    index = _packed_indexes.get(encoded)
    if index is None:
        try:
            items = msgpack.unpackb(encoded)
        except ValueError:  # (msgpack's errors on bytes it did not pack)
            raise ProtocolError("Malformed packed index.") from None
        index = _decode_items(items)
        if len(encoded) <= PACKED_INDEX_BYTES:
            if len(_packed_indexes) >= PACKED_INDEXES_KEPT:
                _packed_indexes.clear()
            _packed_indexes[encoded] = index
    return index


def _decode_items(encoded: Any) -> tuple[Any, ...]:
    if type(encoded) is not list:
        raise ProtocolError(f"An index must be a list, not {type(encoded).__name__}.")
    index: list[Any] = []
    for item in encoded:
        kind = type(item)
        if item is None or kind is int:
            index.append(item)
        elif item == "...":
            index.append(Ellipsis)
        elif kind is list and len(item) == 3 and _slice_parts(*item):
            index.append(slice(*item))
        elif kind is dict and type(item.get("array")) is int and len(item) == 1:
            index.append(IndexArray(item["array"]))
        else:
            raise ProtocolError(f"Malformed index item of type {kind.__name__}.")
    return tuple(index)


def _slice_parts(start: Any, stop: Any, step: Any) -> bool:
    # (a stencil sends several slices an op: a generator here cost a fifth of decode_index)
    return ((start is None or type(start) is int) and (stop is None or type(stop) is int)
            and (step is None or type(step) is int))


def device_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as an array on a device may have it: numeric or bool (not strings, objects,
    dates); anything else raises TypeError."""
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.kind not in "biufc":
        raise TypeError(f"dtype {dtype} cannot live on a device: use a numeric or bool dtype.")
    return dtype


def decode_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """An op's params from the wire, as its numpy implementation takes them (a dtype it is
    given must be a device's: ``device_dtype``)."""
    if "dtype" in params:
        device_dtype(params["dtype"])
    if name in INDEXED_OPS:
        return {**params, "index": decode_index(params.get("index"))}
    if type(params.get("axis")) is list:  # msgpack sent the axis tuple as a list,
        return {**params, "axis": tuple(params["axis"])}  # which numpy refuses
    return params


class SegmentRef(NamedTuple):
    """A slot of shared memory as it travels: ``nbytes`` bytes at ``offset`` in the segment
    ``name`` (whose name says its owner: ``owner``)."""

    name: str
    offset: int
    nbytes: int
    owner: SegmentName


def decode_segment_ref(ref: Any) -> SegmentRef:
    """A slot from the wire; ProtocolError unless it names a fabric segment, with an offset
    and a size that are ints of at least 0."""
    if type(ref) is list and len(ref) == 3 and type(ref[1]) is int and type(ref[2]) is int \
            and ref[1] >= 0 and ref[2] >= 0:
        owner = parse_name(ref[0])
        if owner is not None:
            return SegmentRef(ref[0], ref[1], ref[2], owner)
    raise ProtocolError("A shared-memory slot must be [segment name, offset, nbytes], naming "
                        "a fabric segment (fabric-<boot>-<pid>-<n>).")


ZERO_COPY_BYTES = 64 << 10  # pyzmq's own crossover between copying and sharing a frame


class _FrameMemory:
    """A received frame's bytes, shown to numpy as writable memory.

    A frame received from another process is this process's alone, so writing into it is
    safe; pyzmq only offers a read-only view, and copying 256 MiB costs more than moving it.
    """

    def __init__(self, frame: Any, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.frame = frame  # kept alive as long as any array uses its memory
        address = np.frombuffer(frame.buffer, np.uint8).ctypes.data
        self.__array_interface__ = {"data": (address, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}


def array_from_frame(frame: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An ordinary writable array over a received frame: shared when large, else copied."""
    size = math.prod(shape) * dtype.itemsize  # (np.prod costs ~15 us, on every read)
    if len(frame) != size:  # (a frame, like bytes, has a len() and the buffer protocol)
        raise ProtocolError(f"A buffer of {len(frame)} bytes cannot hold {shape} {dtype}.")
    if size >= ZERO_COPY_BYTES and hasattr(frame, "buffer") and \
            np.frombuffer(frame, np.uint8).ctypes.data % dtype.alignment == 0:
        return np.asarray(_FrameMemory(frame, dtype, shape))
    array = np.frombuffer(frame, dtype).copy()
    # (frombuffer makes it 1-D: a reshape to that costs as much as the copy)
    return array if len(shape) == 1 else array.reshape(shape)


_DTYPE_NAMES: dict[np.dtype, str] = {}  # a handful of numeric dtypes


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.str``, the dtype's name on the wire, without making a new string each call
    (half a microsecond, on every read at both ends)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.str
    return name


def is_wire_scalar(arg: Any) -> bool:
    """Whether ``arg`` has the form of a scalar op argument, as ``decode_scalar`` takes it."""
    kind = type(arg)
    return kind is float or kind is bool or arg is None or kind is list and 1 <= len(arg) <= 2


def decode_scalar(arg: Any) -> Any:
    """A scalar op argument from the wire: a Python float or bool, or None, as it is (msgpack
    tells them from a tensor id, an int), [value] (a Python int) or [value, dtype] (numpy)."""
    kind = type(arg)
    if kind is float or kind is bool or arg is None:
        return arg
    return arg[0] if len(arg) == 1 else np.dtype(arg[1]).type(arg[0])


def encode_scalar(arg: Any) -> Any:
    """A scalar op argument as it travels (the inverse of ``decode_scalar``): None, a bool or a
    float as it is, [value] for a Python int, [value, dtype] for numpy's; anything that is not
    a real scalar raises TypeError, at the call."""
    if arg is None:
        return None
    if isinstance(arg, np.generic):
        value = arg.item()  # (a complex or a date would not pack: refused below)
        if type(value) in (bool, int, float):
            return [value, arg.dtype.str]
    elif isinstance(arg, (bool, float)):
        return arg
    elif isinstance(arg, int):  # (wrapped: a bare int is a tensor id)
        # Past 64 bits only a float tensor accepts it, which makes it a float.
        return [arg] if INT_RANGE[0] <= arg < INT_RANGE[1] else float(arg)
    raise TypeError(f"Cannot use {named(arg)} ({type(arg).__name__}) in a fabric op: use "
                    "tensors, arrays, or real scalars (bool, int, float, or numpy's); "
                    "upload anything else as an array with session.asarray(...).")


def encode_param(name: str, key: str, value: Any) -> Any:
    """Op ``name``'s parameter ``key`` as it travels: None, a bool, an int of 64 bits, a float,
    a str or bytes (a packed index), or a list, tuple or str-keyed dict of them; numpy's
    scalars (and other subclasses) as the Python scalars they hold. Anything else raises
    TypeError, at the call."""
    kind = type(value)
    if kind is bool or kind is float or kind is str or kind is bytes or value is None:
        return value
    if kind is int and INT_RANGE[0] <= value < INT_RANGE[1]:
        return value
    if kind is tuple or kind is list:
        return kind(encode_param(name, key, item) for item in value)
    if kind is dict and all(type(k) is str for k in value):  # (an index's array item)
        return {k: encode_param(name, key, v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return encode_param(name, key, value.item())
    for base in (int, float, str):
        if isinstance(value, base) and kind is not base:
            return encode_param(name, key, base(value))
    raise TypeError(f"{name}: {key}={named(value)} ({kind.__name__}) cannot be sent to a "
                    "device: use None, bools, ints of 64 bits, floats or strings (numpy's too), "
                    "or tuples of them; upload other values as arrays (session.asarray).")


def require_ints(what: str, **ids: Any) -> None:
    """Raise ProtocolError unless each of ``ids`` (tensor and session ids in a message's body)
    is an int: any other value could not even be looked up. ``what`` names the message."""
    bad = {name: value for name, value in ids.items() if type(value) is not int}
    if bad:
        raise ProtocolError(f"{what} names tensors and sessions by int ids; "
                            f"{', '.join(f'{k}={v!r}' for k, v in bad.items())} is not one.")
