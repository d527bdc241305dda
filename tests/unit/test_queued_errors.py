"""A device that queues its work (a GPU) and reports an error of it only when waited for:
the executor waits at the end of each batch, and such an error poisons every tensor the
batch made, naming the ops the device attributes it to; the session goes on (sans I/O)."""

from __future__ import annotations

import numpy as np
import pytest
from test_executor import opened, request, submit

from fabric.workers.backends.base import QueuedError
from fabric.workers.backends.numpy_backend import NumpyDevice

pytestmark = pytest.mark.timeout(30)


class QueuingDevice(NumpyDevice):
    """The numpy device, its work taken as queued: ``failing`` is what its next wait reports
    (an asynchronous error, as CUDA's)."""

    queues = True
    plain_below = 0  # (every op through run)

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.failing: Exception | None = None
        self.waits = 0

    def finish(self) -> None:
        self.waits += 1
        failing, self.failing = self.failing, None
        if failing is not None:
            raise QueuedError("one of the 2 ops queued since the last wait (add, tanh)", failing)


def test_an_error_reported_when_a_batch_is_waited_for_poisons_its_tensors_naming_its_ops():
    device = QueuingDevice(0)
    executor = opened(device=device)
    submit(executor, ["ones", 1, [], {"shape": [3], "dtype": "<f8"}])
    assert device.waits == 1
    device.failing = RuntimeError("cudaErrorIllegalAddress: an illegal memory access")
    submit(executor, ["add", 2, [1, 1.0], {}], ["tanh", 3, [2], {}])
    for tensor in (2, 3):
        error = request(executor, op="read", id=tensor).body["error"]
        assert "one of the 2 ops queued" in error["message"]
        assert "cudaErrorIllegalAddress" in error["message"]
    submit(executor, ["multiply", 4, [1, 2.0], {}])  # the session goes on
    reply = request(executor, op="read", id=4)
    assert np.frombuffer(reply.buffers[0]).tolist() == [2.0, 2.0, 2.0]
