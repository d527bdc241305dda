"""Backend devices a worker can host, and the ones it must refuse.

Rule: a backend is chosen by name here and nowhere else, and its module is imported only
when a worker asks for it (a numpy worker never loads numexpr). Devices that cannot host a
remote server (a capture device records a client's ops; a remote device is itself a client)
are refused with ``DeviceNotHostable`` and a sentence naming what to use instead.
"""

from __future__ import annotations

import importlib

from fabric.core.errors import DeviceNotHostable

from .base import Backend

# Backend name -> (module of this package, device class in it).
BACKENDS = {"numpy": ("numpy_backend", "NumpyDevice"),
            "numexpr": ("numexpr_backend", "NumexprDevice")}

NOT_HOSTABLE = {
    "capture": "a capture device records the ops a client issues; wrap a session in "
               "fabric.capture(session) on the client instead, and run workers with "
               "--backend numpy",
    "remote": "a remote device is a client of another server; point your client at that "
              "server's broker instead, and run workers with --backend numpy",
}


def device_class(backend: str) -> type[Backend]:
    """The device class for a backend name; DeviceNotHostable or ValueError otherwise."""
    if backend in NOT_HOSTABLE:
        raise DeviceNotHostable(
            f"Cannot host a remote server on a {backend} device: {NOT_HOSTABLE[backend]}.",
            backend=backend)
    try:
        module, name = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"Unknown backend {backend!r}: choose one of "
                         f"{', '.join(sorted(BACKENDS))}.") from None
    return getattr(importlib.import_module(f".{module}", __name__), name)
