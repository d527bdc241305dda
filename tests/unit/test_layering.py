"""The layering of DESIGN.md, checked: one allow-list of what each part of the tree may import.

- ``broker/`` and ``workers/`` import, of fabric, only ``fabric.core`` and their own package
  (never each other, never the client side), at module level or inside a function alike;
- the client's subpackages import only downwards: cli -> launch -> client -> graphs -> mesh ->
  transport -> array_api -> arrays -> core (``fabric.core`` imports no other subpackage);
- a broker or worker process, once loaded, holds no other fabric module, and no asyncio.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "arrays", "array_api", "transport", "mesh", "graphs", "client", "launch", "cli")
SERVERS = ("broker", "workers")


def installed_name(path: Path) -> str:
    """The module's name once installed (``broker/server.py`` -> ``fabric.broker.server``)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "fabric" else ["fabric", *parts])


def imported(path: Path) -> Iterator[tuple[str, int]]:
    """Every module ``path`` imports, anywhere in it, relative imports resolved, with its line."""
    name = installed_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            for alias in node.names:  # (``from pkg import module`` imports pkg.module)
                yield (f"{base}.{alias.name}" if node.module is None else base), node.lineno


def allowed(importer: str, target: str) -> bool:
    """Whether module ``importer`` may import ``target`` (both as installed)."""
    if target.split(".")[0] in SERVERS:
        return False  # (the folders exist only as fabric.broker and fabric.workers)
    parts = target.split(".")
    if parts[0] != "fabric" or len(parts) == 1:
        return True  # the standard library, third parties, and the package root's names
    own = importer.split(".")[1] if "." in importer else ""
    if own in SERVERS:
        return parts[1] in ("core", own)
    if parts[1] in SERVERS:
        return own in ("cli", "launch")  # (which start them as processes)
    if own in LAYERS and parts[1] in LAYERS:
        return LAYERS.index(parts[1]) <= LAYERS.index(own)
    return True  # the package root (``connect``, ``__init__``) sits above every layer


def violations() -> list[str]:
    found = []
    for folder in ("fabric", *SERVERS):
        for path in sorted((REPO / folder).rglob("*.py")):
            importer = installed_name(path)
            for target, line in imported(path):
                if not allowed(importer, target):
                    found.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    return found


def test_every_import_is_on_the_allow_list() -> None:
    assert violations() == []


@pytest.mark.parametrize("importer, target, ok", [
    ("fabric.broker.registry", "fabric.core.protocol", True),
    ("fabric.broker.registry", "fabric.broker.model", True),
    ("fabric.broker.registry", "fabric.workers.executor", False),
    ("fabric.workers.executor", "fabric.arrays.tensor", False),
    ("fabric.workers.executor", "fabric.api", False),
    ("fabric.workers.executor", "workers.lane", False),
    ("fabric.arrays.tensor", "fabric.transport.bulk", False),
    ("fabric.core.wire", "fabric.arrays.stream", False),
    ("fabric.cli.main", "fabric.launch.local", True),
    ("fabric.mesh.sharded", "fabric.transport.moves", True),
    ("fabric.cli.main", "fabric.workers.control_io", True),
    ("fabric.client.session", "fabric.broker.model", False),
    ("fabric.arrays.tensor", "fabric.array_api.namespace", False),
    ("fabric.client.session", "fabric.array_api", True),
])
def test_the_allow_list_refuses_what_it_should(importer: str, target: str, ok: bool) -> None:
    # (so that the check above cannot pass by allowing everything)
    assert allowed(importer, target) is ok


@pytest.mark.parametrize("module", ["fabric.broker.server", "fabric.workers.control_io"])
def test_a_broker_or_worker_process_loads_only_the_core(module: str) -> None:
    probe = (f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'asyncio' or "
             f"m.startswith('fabric.') and m.split('.')[1] not in ('core', {module.split('.')[1]!r}"
             ")))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
