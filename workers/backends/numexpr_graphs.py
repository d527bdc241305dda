"""A numexpr device's graph plans: elementwise runs become numexpr programs, compiled once.

Rule: a graph is compiled per signature, so every op's shape and dtype is known before its
first call, and everything about its programs is decided then. An op is *fused* where a
streamed op would be (``deferral``: numexpr computes it as numpy does, for these dtypes). A
fused op's value is *inlined* into the one op that reads it when that op is fused too and the
value is no output: one program computes a *root* (a fused op whose value is not inlined)
and everything inlined into it in one pass, from its leaves (inputs, other steps' results,
typed scalars). Bounds are a streamed expression's (``MAX_OPS``, ``MAX_TEXT``,
``MAX_LEAVES``): past them, the biggest inlined operand is made a root of its own.

A root's program is used where numexpr is faster than numpy's calls: on at least the device's
``min_size`` elements, or, below numexpr's threading threshold, for ``SERIAL_OPS`` ops or
more; elsewhere its ops run as the numpy device's calls.

Fused templates fail only for want of resources: a program that fails runs its ops again one
at a time with numpy, and names the op that fails (``GraphOpError``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from fabric.core.ops import OPS, Op, Spec

from .base import Constant, GraphOp, GraphOpError, GraphStep, graph_step
from .numexpr_deferred import MAX_LEAVES, MAX_OPS, MAX_TEXT
from .numexpr_rules import Deferral, call_program, cast_template, deferral, descriptor, \
    inline_power

# numexpr evaluates fewer elements than this on one thread (its interpreter's rule: four of
# its 1024-element blocks); above it, up to ``min_size``, its threads cost more than they give.
SERIAL_BELOW = 4 * 1024
# ... and there a program of this many ops beats numpy's calls (on 1K float64 here, 10 ops:
# 22 us against 26; 50 ops: 81 us against 122).
SERIAL_OPS = 8


class NumexprDevice(Protocol):
    """What a plan needs of its device (``numexpr_backend.NumexprDevice``)."""

    min_size: int
    ops_fused: int
    expressions_evaluated: int

    def bind(self, op: Op, params: dict[str, Any]) -> Callable[..., Any]: ...

    def scalar(self, value: Any, dtype: np.dtype) -> np.ndarray: ...

    def compiled(self, expression: str, types: Sequence[np.dtype]) -> tuple[Any, bool]: ...


class _Fused:
    """A fused op while a plan is made: how it is deferred, what is inlined into it (by
    operand position, with the cast that makes it the type the op takes), and its sizes."""

    __slots__ = ("op", "how", "inlined", "ops", "text", "leaves")

    def __init__(self, op: GraphOp, how: Deferral) -> None:
        self.op = op
        self.how = how
        self.inlined: dict[int, tuple[_Fused, Any]] = {}
        self.ops, self.text, self.leaves = 1, 1, frozenset()

    def measure(self) -> None:
        """Its expression's sizes: ops, ops spelled, distinct leaves."""
        leaves = set(_own_leaves(self))
        self.ops, self.text = 1, 1
        for position, (child, _) in self.inlined.items():
            self.ops += child.ops
            self.text += self.how.uses[position] * child.text
            leaves |= child.leaves
        self.leaves = frozenset(leaves)

    def too_big(self) -> bool:
        return self.ops >= MAX_OPS or self.text > MAX_TEXT or len(self.leaves) > MAX_LEAVES

    def subtree(self) -> list[GraphOp]:
        """The ops its program computes, in the graph's order."""
        found = [self.op]
        for child, _ in self.inlined.values():
            found += child.subtree()
        return sorted(found, key=lambda op: op.index)


def fused_steps(device: NumexprDevice, ops: list[GraphOp], specs: dict[int, Spec],
                outputs: list[int]) -> list[GraphStep]:
    """The steps of a graph's ``ops`` on ``device``, in op order: programs for its fused
    runs where numexpr is faster, the numpy device's calls for the rest."""
    readers: dict[int, set[int]] = {}
    for op in ops:
        for arg in op.args:
            if type(arg) is int:
                readers.setdefault(arg, set()).add(op.index)
    fused: dict[int, _Fused] = {}  # by the local id it makes
    inlined: set[int] = set()
    for op in ops:
        how = _deferral(op, specs)
        if how is None:
            continue
        node = fused[op.out] = _Fused(op, how)
        for position, source in enumerate(how.sources):
            arg = op.args[source]
            child = fused.get(arg) if type(arg) is int else None
            if child is None or arg in outputs or readers[arg] != {op.index} \
                    or [a for a in op.args if type(a) is int].count(arg) > 1:
                continue  # (a value read twice by one op is computed once, as a root)
            wanted = how.types[position]
            cast = None if child.how.out == wanted else cast_template(child.how.out, wanted)
            if child.how.out == wanted or cast is not None:
                node.inlined[position] = (child, cast)
                inlined.add(arg)
        node.measure()
        while node.too_big() and node.inlined:
            position = max(node.inlined, key=lambda p: node.inlined[p][0].ops)
            inlined.discard(node.inlined.pop(position)[0].op.out)
            node.measure()
    steps = []
    for op in ops:
        node = fused.get(op.out)
        if node is None:
            steps.append(graph_step(device.bind(OPS[op.name], op.params), op))
        elif op.out not in inlined:
            steps += _root_steps(device, node)
    return sorted(steps, key=lambda step: step.ops[-1])


def _deferral(op: GraphOp, specs: dict[int, Spec]) -> Deferral | None:
    """How ``op`` is fused, or None where numpy runs it."""
    if not OPS[op.name].elementwise or op.params or op.spec is None or 0 in op.spec.shape:
        return None  # (numexpr broadcasts empty operands otherwise than numpy)
    if any(type(a) is int and a not in specs for a in op.args):
        return None
    descriptors = tuple(descriptor(specs[a] if type(a) is int else a.value) for a in op.args)
    power = None
    if op.name == "power" and len(op.args) == 2:
        base, exponent = op.args
        if type(exponent) is not int:
            power = inline_power(None, exponent.value)
        elif math.prod(specs[exponent].shape) == 1 and \
                len(specs[exponent].shape) <= len(op.spec.shape):
            return None  # numpy takes its fast paths for a value only the call knows
    how = deferral(op.name, descriptors, power)
    if how is not None and not all(_fits(op.args[s], t) for s, t in zip(how.sources, how.types)):
        return None  # numpy refuses such an int, or compares it by value: its call says
    return how


def _fits(arg: Any, dtype: np.dtype) -> bool:
    """Whether an operand can be handed to numexpr as ``dtype`` (a Python int may not)."""
    if type(arg) is int:
        return True  # a local id
    try:
        np.asarray(arg.value, dtype)
    except OverflowError:
        return False
    return True


def _own_leaves(node: _Fused) -> list[Any]:
    """The leaves ``node``'s own op reads (not those inlined into it), as keys: a local id
    and the type numexpr sees it as, or a constant's identity."""
    how, leaves = node.how, []
    for position, source in enumerate(how.sources):
        arg = node.op.args[source]
        if position not in node.inlined:
            leaves.append((arg, how.types[position]) if type(arg) is int else (id(arg),))
    return leaves + [(id(array),) for array, _ in how.constants]


def _root_steps(device: NumexprDevice, root: _Fused) -> list[GraphStep]:
    """The program step of ``root``, or its ops' numpy calls where numexpr is not faster."""
    size = math.prod(root.op.spec.shape)
    if size < device.min_size and not (size < SERIAL_BELOW and root.ops >= SERIAL_OPS):
        return [graph_step(device.bind(OPS[op.name], {}), op) for op in root.subtree()]
    names: dict[Any, str] = {}
    args: list[Any] = []
    types: list[np.dtype] = []

    def leaf(key: Any, arg: Any, dtype: np.dtype) -> str:
        if key not in names:
            names[key] = f"v{len(args)}"
            args.append(arg)
            types.append(dtype)
        return names[key]

    def spell(node: _Fused) -> str:
        how, texts = node.how, []
        for position, source in enumerate(how.sources):
            arg, dtype = node.op.args[source], how.types[position]
            if position in node.inlined:
                child, cast = node.inlined[position]
                text = spell(child)
                if cast is not None:
                    template, constants = cast
                    text = template.format(text, *[leaf((id(a),), Constant(a), t)
                                                   for a, t in constants])
            elif type(arg) is int:
                text = leaf((arg, dtype), arg, dtype)
            else:
                scalar = device.scalar(arg.value, dtype)
                text = leaf((id(scalar),), Constant(scalar), dtype)
            texts.append(text)
        texts += [leaf((id(a),), Constant(a), t) for a, t in how.constants]
        return how.template.format(*texts)

    program = Program(device, device.compiled(spell(root), types), root.subtree(),
                      [a if type(a) is int else None for a in args])
    return [GraphStep(program, args, root.op.out, tuple(op.index for op in program.ops),
                      fresh=True)]


class Program:
    """A step of a graph's plan: one numexpr program that computes ``ops`` (the root last)
    from its leaves, given in its variables' order (``leaves``: the local id of each, None
    for a constant). It writes into ``out=`` where given; where numexpr fails it runs the
    ops one at a time with numpy, naming the op that fails (``GraphOpError``)."""

    __slots__ = ("device", "program", "uses_vml", "ops", "leaves")

    def __init__(self, device: NumexprDevice, compiled: tuple[Any, bool], ops: list[GraphOp],
                 leaves: list[int | None]) -> None:
        self.device = device
        self.program, self.uses_vml = compiled
        self.ops = ops
        self.leaves = leaves

    def __call__(self, *args: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        try:
            result = call_program(self.program, self.uses_vml, args, out=out)
        except Exception as exc:
            return self._one_at_a_time(args, exc)
        self.device.ops_fused += len(self.ops)
        self.device.expressions_evaluated += 1
        return result

    def _one_at_a_time(self, args: tuple[np.ndarray, ...], error: Exception) -> np.ndarray:
        values = {leaf: arg for leaf, arg in zip(self.leaves, args) if leaf is not None}
        for op in self.ops:
            try:
                values[op.out] = OPS[op.name].impl(
                    *[values[a] if type(a) is int else a.value for a in op.args])
            except Exception as exc:
                raise GraphOpError(op.index, exc) from None
        return np.asarray(values[self.ops[-1].out])
