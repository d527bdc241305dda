"""A graph's size is bounded (issue 41, finding 6): a registration of more than
``MAX_GRAPH_OPS`` ops, which the worker would compile in one call that holds the GIL, is
refused by the worker before anything is built from it, and a trace that long by the client,
each with a typed error that names the bound and what to do. The attack itself, a graph of
300,000 ops in one SUBMIT against a real worker: ``test_liveness.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fabric
from fabric.core.errors import GraphError, TraceError
from fabric.core.wire import MAX_GRAPH_OPS
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.registered_graphs import register


def graph_params(ops: int) -> dict[str, Any]:
    chain = [["add", i + 2, [i + 1, 1.0], {}] for i in range(ops)]
    return {"graph": 7, "name": "long", "ops": chain, "inputs": [[[4], "<f8"]],
            "outputs": [ops + 1]}


def test_the_worker_refuses_a_graph_past_the_bound_naming_it_and_what_to_do():
    device = NumpyDevice(0)
    assert register(graph_params(MAX_GRAPH_OPS), device).plan is not None  # at the bound
    with pytest.raises(GraphError) as refused:
        register(graph_params(MAX_GRAPH_OPS + 1), device)
    assert f"more than the {MAX_GRAPH_OPS} a graph may hold" in refused.value.message
    assert "trace a smaller function" in refused.value.message
    assert refused.value.details == {"graph": 7, "ops": MAX_GRAPH_OPS + 1,
                                     "limit": MAX_GRAPH_OPS}


def test_the_client_refuses_to_trace_a_graph_past_the_bound(shared_cluster):
    @fabric.function
    def long_chain(x):
        for _ in range(MAX_GRAPH_OPS + 1):
            x = x + 1.0
        return x

    with shared_cluster.connect() as session:
        with pytest.raises(TraceError, match=f"more than the {MAX_GRAPH_OPS} a graph may hold"):
            long_chain(session.asarray(np.zeros(4)))
        assert session.arange(3).sum().numpy() == 3  # nothing sent, the session goes on
