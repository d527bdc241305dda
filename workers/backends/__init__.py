"""Backend devices a worker can host, and the ones it must refuse.

Rule: a backend is chosen by name here and nowhere else, and its module is imported only
when a worker asks for it (a numpy worker never loads numexpr, nor jax). Devices that cannot
host a remote server (a capture device records a client's ops; a remote device is itself a
client) are refused with ``DeviceNotHostable`` and a sentence naming what to use instead; a
backend whose package is not installed is refused with ``BackendMissing``, naming the extra
that installs it, and one whose hardware this host lacks (``Backend.check_host``: a cupy
device without a CUDA device) alike, naming what is missing. What a backend reads from the
environment as its module loads is set by ``prepare``, before.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys

from fabric.core.errors import BackendMissing, DeviceNotHostable

from .base import Backend

# Backend name -> (module of this package, device class in it).
BACKENDS = {"numpy": ("numpy_backend", "NumpyDevice"),
            "numexpr": ("numexpr_backend", "NumexprDevice"),
            "jax": ("jax_backend", "JaxDevice"),
            "cupy": ("cupy_backend", "CupyDevice")}
# The backends that need a package fabric does not install by itself -> that package, and
# the extra of fabric-arrays that installs it
EXTRAS = {"jax": ("jax", "jax"), "cupy": ("cupy", "cupy")}
_HOST_DEVICES = "--xla_force_host_platform_device_count"

NOT_HOSTABLE = {
    "capture": "a capture device records the ops a client issues; wrap a session in "
               "fabric.capture(session) on the client instead, and run workers with "
               "--backend numpy",
    "remote": "a remote device is a client of another server; point your client at that "
              "server's broker instead, and run workers with --backend numpy",
}


def device_class(backend: str) -> type[Backend]:
    """The device class for a backend name; DeviceNotHostable (BackendMissing where its
    package is not installed) or ValueError otherwise."""
    if backend in NOT_HOSTABLE:
        raise DeviceNotHostable(
            f"Cannot host a remote server on a {backend} device: {NOT_HOSTABLE[backend]}.",
            backend=backend)
    try:
        module, name = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"Unknown backend {backend!r}: choose one of "
                         f"{', '.join(sorted(BACKENDS))}.") from None
    try:
        loaded = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as exc:
        package, extra = EXTRAS.get(backend, (None, None))
        if package is None or exc.name != package:
            raise
        raise BackendMissing(
            f"Cannot host a {backend} device: {package} is not installed in this Python "
            f"({sys.executable}). Install fabric's [{extra}] extra there "
            f"(pip install 'fabric-arrays[{extra}]'), or run the worker with --backend numpy.",
            backend=backend) from None
    device = getattr(loaded, name)
    device.check_host()
    return device


def prepare(backend: str, devices: int) -> None:
    """Set, before a backend's module loads, what it reads from the environment then: a jax
    worker on a CPU host gets one XLA host device per device it hosts (XLA_FLAGS; where the
    flag is set already, or jax is loaded, it stays as it is), and on a GPU takes memory as
    its tensors need it, not three quarters of the GPU at start (the worker's budget and
    metrics count its tensors; another process may share the GPU). A GPU worker starts any
    process of its own with spawn, never fork (a forked child of a process holding a CUDA
    context cannot use it)."""
    if backend == "cupy":
        multiprocessing.set_start_method("spawn", force=True)
    if backend != "jax" or "jax" in sys.modules:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if _HOST_DEVICES not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_HOST_DEVICES}={devices}".strip()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
