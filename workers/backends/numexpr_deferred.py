"""A numexpr device's deferred values: expressions not computed yet, and their sizes.

Rule: a deferred value is a node of an expression whose leaves are typed arrays, and it
knows its expression's sizes (distinct ops, ops spelled, distinct leaves), kept up to date
as parts of it are evaluated, so that the device cuts an expression past a bound
(``MAX_OPS``, ``MAX_TEXT``, ``MAX_LEAVES``) before numexpr is asked to compile it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .base import Backend, DeferredValue

MAX_OPS = 64  # distinct ops in one expression (numexpr computes a value used twice once)
MAX_TEXT = 512  # ops in its text, where a value used n times is spelled n times
MAX_LEAVES = 32  # distinct input arrays (and scalars) of one expression
_EMPTY: frozenset = frozenset()


class Deferred(DeferredValue):
    """An elementwise result not computed yet: a numexpr template over its operands.

    ``operands`` are deferred values of exactly the dtype the template expects, or leaves:
    ``(array, dtype)`` pairs, the dtype being the one numexpr is told (it casts the array).
    ``shape``, ``dtype`` and ``nbytes`` are those of the result, so the executor charges the
    memory quota as if the value were computed, exactly as on the numpy device. Code that
    takes it for an array (``np.asarray``) gets it evaluated by its device.

    ``failure`` is the exception its op failed with when its chain was evaluated (every
    later evaluation that needs it raises ``DeferredError`` again, as poison flows), and
    ``error`` is the executor's wire error for that failure, so it is reported once.
    """

    __slots__ = ("device", "op", "shape", "dtype", "template", "operands", "nodes", "text",
                 "leaves", "sized", "value", "failure", "error")

    def __init__(self, device: Backend, op: str, shape: tuple[int, ...],
                 dtype: np.dtype, template: str, operands: tuple[Any, ...],
                 size: tuple[frozenset, int, frozenset]) -> None:
        self.device = device
        self.op = op
        self.shape = shape
        self.dtype = dtype
        self.template = template
        self.operands = operands
        nodes, self.text, self.leaves = size  # see measure
        self.nodes = nodes | {id(self)}
        self.sized = device.expressions_evaluated  # sizes stale once a part is evaluated
        self.value: np.ndarray | None = None
        self.failure: BaseException | None = None
        self.error: dict[str, Any] | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.device.materialize(self)
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self) -> str:
        state = "evaluated" if self.value is not None else f"{len(self.nodes)} ops deferred"
        return f"<Deferred {self.op} {self.shape} {self.dtype}: {state}>"



def too_big(size: tuple[frozenset, int, frozenset]) -> bool:
    return len(size[0]) >= MAX_OPS or size[1] > MAX_TEXT or len(size[2]) > MAX_LEAVES


def walk(node: Deferred) -> list[Deferred]:
    """The deferred values ``node``'s expression still computes, ``node`` last."""
    found: dict[int, Deferred] = {}

    def visit(item: Deferred) -> None:
        if item.value is None and id(item) not in found:
            for operand in item.operands:
                if type(operand) is Deferred:
                    visit(operand)
            found[id(item)] = item

    visit(node)
    return list(found.values())


def refresh(node: Deferred, done: dict[int, bool], epoch: int) -> None:
    """Recompute the sizes of ``node``'s expression, values evaluated since as leaves
    (``epoch``: the device's evaluation count; nothing to do if none happened since)."""
    if id(node) in done or node.value is not None or node.sized == epoch:
        return
    done[id(node)] = True
    node.sized = epoch
    operands = []
    for operand in node.operands:
        if type(operand) is Deferred and operand.value is not None:
            operand = (operand.value, operand.dtype)
        elif type(operand) is Deferred:
            refresh(operand, done, epoch)
        operands.append(operand)
    uses = [node.template.count(f"{{{i}}}") for i in range(len(operands))]
    nodes, node.text, node.leaves = measure(operands, uses)
    node.nodes = nodes | {id(node)}


def measure(operands: Sequence[Any], uses: Sequence[int]) -> tuple[frozenset, int, frozenset]:
    """An expression over ``operands``, without its own op: the deferred ops it holds (ids,
    each once), the ops its text spells, and its distinct leaves (array id and dtype)."""
    nodes: frozenset = _EMPTY
    leaves: frozenset = _EMPTY
    text = 1
    own = []
    for operand, count in zip(operands, uses):
        if type(operand) is Deferred:
            nodes = operand.nodes if not nodes else nodes | operand.nodes
            leaves = operand.leaves if not leaves else leaves | operand.leaves
            text += count * operand.text
        else:
            own.append((id(operand[0]), operand[1].char))
    return nodes, text, leaves.union(own) if own else leaves
