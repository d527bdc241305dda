"""Device warnings on the client: numpy's warnings on a device, issued as ``RemoteWarning``.

Rule: the warnings a reply carries (``fabric.core.wire.DeviceWarning``) are issued through Python's
``warnings`` with ``warn_explicit``, at the line of user code that issued the op (inside a
traced function, its line there), with that module's name and warning registry, so that
every filter treats them as it treats numpy's own warnings in local code: ``"default"`` gives
each message once per line, ``"error"`` raises at the read or sync that brought it,
``"ignore"`` drops it, and ``module=`` and ``lineno=`` match the user's module and line.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any

from fabric.arrays.origins import issued_at, origin_line
from fabric.core.errors import RemoteWarning
from fabric.core.wire import MAX_WARNINGS, DeviceWarning, decode_warnings

_MODULES: dict[str, ModuleType | None] = {}  # file name -> the module loaded from it
_REGISTRIES: dict[str, dict[Any, Any]] = {}  # for a file that is no module's (exec, a cell)


def issue_warnings(body: dict[str, Any], stream: Any) -> None:
    """Issue the device warnings of a REPLY ``body`` for the session whose op stream is
    ``stream`` (``fabric.arrays.stream.OpStream``: it knows where each op was issued)."""
    found, dropped = decode_warnings(body)
    for warning in found:
        _warn(warning.message, *_site(warning, stream))
    if dropped:
        _warn(f"{dropped} more floating-point warnings on the device were not carried back "
              f"(a reply carries the first {MAX_WARNINGS} distinct ones since the last): read "
              "or sync more often to see each.", *origin_line(issued_at()))


def _site(warning: DeviceWarning, stream: Any) -> tuple[str, int]:
    """Where the op that warned was issued (or, if that is forgotten, the read that brought
    the warning)."""
    graph = stream.graphs.get(warning.graph)
    index = warning.graph_op
    if graph is not None and type(index) is int and 0 <= index < len(graph.origins):
        return graph.origins[index]
    origin = stream.origins.get(warning.tensor)
    if origin is None or origin[0] is None:
        origin = issued_at()
    return origin_line(origin)


def _warn(message: str, file: str, line: int) -> None:
    module = _module_of(file)
    if module is None:
        registry = _REGISTRIES.setdefault(file, {})
        warnings.warn_explicit(message, RemoteWarning, file, line, registry=registry)
        return
    registry = module.__dict__.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, RemoteWarning, file, line, module=module.__name__,
                           registry=registry, module_globals=module.__dict__)


def _module_of(file: str) -> ModuleType | None:
    """The loaded module whose source is ``file``, if any (looked up once per file)."""
    if file not in _MODULES:
        _MODULES[file] = next((m for m in list(sys.modules.values())
                               if getattr(m, "__file__", None) == file), None)
    return _MODULES[file]
