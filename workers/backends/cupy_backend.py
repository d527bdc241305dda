"""The cupy device: the op table over CuPy on one NVIDIA GPU, elementwise runs of graphs
fused into one kernel each, transfers through reused pinned buffers.

Rule: this device computes what the numpy device computes: every result's dtype is checked
against the op table's, which the client inferred, and an op whose dtype CuPy makes
otherwise is refused with ``DtypeNotSupported`` naming it, never computed in another
precision; numpy's extended precision (float128, complex256) is refused at the call (the
device's settings list the dtypes it holds). What CuPy spells otherwise, and the fusion of a
graph's elementwise runs, are ``cupy_ops`` (written against the module, and run on a CPU with
numpy standing in); this module holds only what needs CUDA.

A host without a CUDA device (CuPy installed, no GPU or no driver) cannot hold one:
``check_host`` refuses it with a sentence, and the worker exits 2. A worker hosting GPUs is
started as a fresh process and starts its own with spawn (``backends.prepare``): never fork.

- Memory: arrays live in CuPy's memory pool on the device, whose limit is the worker's
  ``--memory-limit`` (``MemoryPool.set_limit``), so an allocation past it fails inside CuPy
  too, as the executor's admission refuses an op past it; metrics count ``nbytes``.
- Transfers: an upload or a read of ``STAGED_FROM`` bytes or more goes through two reused
  pinned host buffers of ``STAGING_BYTES`` each (``staging.StagingBuffers``): the copy into
  one overlaps the GPU's copy out of the other, on the device's stream.
- Errors: a kernel runs asynchronously; CUDA reports some errors only when its stream is
  waited for. The executor waits at the end of each batch (``finish``): such an error then
  poisons the batch's tensors, naming the ops queued since the last wait. With
  ``FABRIC_CUDA_SYNCHRONOUS=1`` in the worker's environment every op is waited for, and the
  one that failed is named alone (slower: a debugging mode, as CUDA_LAUNCH_BLOCKING).
- Graphs: a registered graph, and a batch of streamed ops seen again (``compiles_batches``),
  run as ``cupy_ops.fused_steps``: one ``cupy.fuse`` kernel per elementwise run.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import cupy
import cupyx
import numpy as np

from fabric.core.errors import BackendMissing, DtypeNotSupported
from fabric.core.flow import COMPILES_BATCHES
from fabric.core.ops import Op, Spec
from fabric.core.worker_options import WorkerOptions

from .base import FIXED_WIDTH_DTYPES, Backend, GraphOp, GraphStep, QueuedError
from .cupy_ops import fusable_ops, fused_steps, spelled
from .staging import StagingBuffers

STAGING_BYTES = 8 << 20  # each of a device's two pinned buffers
STAGED_FROM = 1 << 20  # smaller transfers are one plain copy (their staging costs more)
SYNCHRONOUS = "FABRIC_CUDA_SYNCHRONOUS"
QUEUED_NAMES = 8  # the ops of a batch an asynchronous error names (the first and last ones)


def _gpu_count() -> tuple[int, str]:
    """How many CUDA devices CuPy finds, and why none where it finds none."""
    try:
        return cupy.cuda.runtime.getDeviceCount(), ""
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return 0, str(exc)


class CupyDevice(Backend):
    """One cupy device of a worker: CUDA device number ``index`` of this process.

    Counters: ``ops_fused``, the ops computed inside fused kernels; ``expressions_evaluated``,
    those kernels' calls.
    """

    backend = "cupy"
    xp = cupy
    compiles_batches = True
    counts_work = True
    queues = True

    @classmethod
    def check_host(cls) -> None:
        """Refuse a host where CuPy finds no CUDA device."""
        count, why = _gpu_count()
        if count == 0:
            raise BackendMissing(
                f"Cannot host a cupy device: CuPy {cupy.__version__} is installed, but finds "
                f"no CUDA device on this machine{f' ({why})' if why else ''}. Run the worker "
                "where an NVIDIA GPU and its driver are, or with --backend numpy (or "
                "--backend jax, which runs on this CPU).", backend="cupy")

    @classmethod
    def for_worker(cls, index: int, options: WorkerOptions) -> "CupyDevice":
        """Device ``index``, its memory pool limited to the worker's ``--memory-limit``."""
        return cls(index, options.memory_limit)

    def __init__(self, index: int, memory_limit: int | None = None) -> None:
        count, _ = _gpu_count()
        if index >= count:
            raise BackendMissing(
                f"This worker hosts cupy device {index}, but CuPy finds {count} CUDA "
                f"device(s): start it with --devices {count} or fewer.", backend="cupy")
        self.gpu = cupy.cuda.Device(index)
        with self.gpu:
            self.pool = cupy.get_default_memory_pool()
            if memory_limit is not None:
                self.pool.set_limit(size=memory_limit)
            self.name = cupy.cuda.runtime.getDeviceProperties(index)["name"].decode()
            self.memory_bytes = self.gpu.mem_info[1]
        self.stream: Any = None  # (made on the device's thread, by on_thread)
        self.staging = StagingBuffers(_pinned, STAGING_BYTES)
        self.synchronous = os.environ.get(SYNCHRONOUS) == "1"
        self.queued: list[str] = []
        self.spelled = spelled(cupy, cupy.asnumpy)
        super().__init__(index)

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        return {"backend": self.backend, "version": cupy.__version__, "numpy": np.__version__,
                "device": self.name, "cuda": cupy.cuda.runtime.runtimeGetVersion(),
                "fuses": sorted(fusable_ops(cupy)), "compiles": COMPILES_BATCHES,
                "dtypes": sorted(dtype.name for dtype in FIXED_WIDTH_DTYPES),
                "memory_bytes": self.memory_bytes,
                "staging_bytes": 2 * STAGING_BYTES, "synchronous": self.synchronous}

    def implementation(self, op: Op) -> Callable[..., Any]:
        """``op``'s function: ``cupy_ops``' where CuPy spells it otherwise, else the table's
        build over cupy."""
        return self.spelled.get(op.name) or op.over(cupy)

    # -- running ops --------------------------------------------------------------------

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Any:
        """Run one op of the table, queued on the device's stream; its dtype numpy's or the
        op refused."""
        expected = np.dtype(op.result_dtype(
            [Spec(x.shape, x.dtype) if isinstance(x, cupy.ndarray) else x for x in inputs],
            params))
        self.queued.append(op.name)
        result = cupy.asarray(self.implementations[op.name](*inputs, **params))
        if result.dtype != expected:
            raise DtypeNotSupported(
                f"The cupy device computes {op.name} as {result.dtype}, where numpy makes "
                f"{expected}: it refuses the op rather than give another precision. Run it "
                f"on a numpy device, or astype the operands first.",
                backend=self.backend, dtype=str(expected))
        if self.synchronous:
            self._wait()  # (an error raised here names this op alone)
        return result

    def finish(self) -> None:
        """Wait for the ops queued since the last wait; an error CUDA reports then names
        them."""
        if not self.queued:
            return
        try:
            self._wait()
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            queued, self.queued = self.queued, []
            shown = queued if len(queued) <= QUEUED_NAMES else [
                *queued[:QUEUED_NAMES // 2], "...", *queued[-QUEUED_NAMES // 2:]]
            raise QueuedError(
                f"one of the {len(queued)} ops queued on the GPU since the last wait "
                f"({', '.join(shown)}; set {SYNCHRONOUS}=1 in the worker's environment to "
                "name the one)", exc) from exc

    def _wait(self) -> None:
        self.queued = []
        (self.stream or cupy.cuda.get_current_stream()).synchronize()

    def held(self, result: Any) -> Any:
        """A graph's output as it is: a cupy array (0-d ones too)."""
        return cupy.asarray(result)

    def stats(self) -> dict[str, Any]:
        """Its memory pool's figures, for ``session.stats()``."""
        return {"device_pool_used_bytes": self.pool.used_bytes(),
                "device_pool_held_bytes": self.pool.total_bytes(),
                "device_staging_bytes": self.staging.held_bytes()}

    # -- transfers ----------------------------------------------------------------------

    def from_host(self, array: np.ndarray) -> Any:
        """An upload or a tensor moved here, copied into GPU memory (through the pinned
        buffers, from ``STAGED_FROM`` bytes)."""
        if array.dtype not in FIXED_WIDTH_DTYPES:
            raise DtypeNotSupported(
                f"The cupy device cannot hold {array.dtype} (CUDA has no such type): the "
                "upload is refused rather than computed in another precision. astype to "
                "float64 or complex128 first.", backend="cupy", dtype=str(array.dtype))
        if array.nbytes < STAGED_FROM:
            return cupy.asarray(array)
        placed = cupy.empty(array.shape, array.dtype)
        target = placed.reshape(-1).view(cupy.uint8)
        stream = self.stream or cupy.cuda.get_current_stream()

        def write(part: slice, buffer: np.ndarray) -> Callable[[], None]:
            target[part].set(buffer, stream=stream)
            return stream.record().synchronize

        self.staging.upload(np.ascontiguousarray(array).reshape(-1).view(np.uint8), write)
        return placed

    def to_host(self, value: Any) -> np.ndarray:
        """A tensor's values, copied into host memory (through the pinned buffers, from
        ``STAGED_FROM`` bytes)."""
        if value.nbytes < STAGED_FROM:
            return cupy.asnumpy(value)
        copied = np.empty(value.shape, value.dtype)
        source = cupy.ascontiguousarray(value).reshape(-1).view(cupy.uint8)
        stream = self.stream or cupy.cuda.get_current_stream()

        def read(part: slice, buffer: np.ndarray) -> Callable[[], None]:
            source[part].get(stream=stream, out=buffer, blocking=False)
            return stream.record().synchronize

        self.staging.download(copied.reshape(-1).view(np.uint8), read)
        return copied

    @contextlib.contextmanager
    def on_thread(self) -> Iterator[None]:
        """The device's thread: its GPU current, its own stream, and numpy's linear
        algebra errors (a singular matrix raises, as numpy's LAPACK makes it)."""
        with self.gpu:
            self.stream = cupy.cuda.Stream(non_blocking=True)
            with self.stream, cupyx.errstate(linalg="raise"):
                yield

    # -- graphs -------------------------------------------------------------------------

    def graph_steps(self, ops: list[GraphOp], specs: dict[int, Spec],
                    outputs: list[int]) -> list[GraphStep]:
        """Each elementwise run one ``cupy.fuse`` kernel (``cupy_ops.fused_steps``)."""
        return fused_steps(ops, specs, outputs, cupy, cupy.fuse, self.bind, self._fused)

    def _fused(self, ops: int) -> None:
        self.ops_fused += ops
        self.expressions_evaluated += 1


def _pinned(size: int) -> np.ndarray:
    """``size`` bytes of pinned host memory, as a uint8 array."""
    return np.frombuffer(cupy.cuda.alloc_pinned_memory(size), np.uint8, size)
