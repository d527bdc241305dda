"""Rough edges a data scientist and an operator hit (issue 47), each tried as they would."""

from __future__ import annotations

import numpy as np
import pytest

import fabric

# A value that shows in any message that printed the tensor's elements.
TELLTALE = 7777.25


def test_an_error_about_another_sessions_tensor_names_both_and_reads_nothing(cluster):
    with fabric.connect(cluster.address, token=cluster.token, timeout=10) as first, \
            first.open(0) as second:
        theirs = second.asarray(np.full((300, 300), TELLTALE))
        mine = first.asarray(np.ones((300, 300)))
        attempts = [lambda: mine + theirs, lambda: first.asarray(theirs),
                    lambda: fabric.function(lambda a, b: a * b)(mine, theirs)]
        for attempt in attempts:
            with pytest.raises(ValueError) as refused:
                attempt()
            message = str(refused.value)
            assert "7777" not in message and len(message) < 400, message
            assert f"session={second.id:#x}" in message and "shape=(300, 300)" in message
            assert "move it with .to(session)" in message
        # (the advice works)
        assert float((mine + theirs.to(first)).numpy()[0, 0]) == TELLTALE + 1
