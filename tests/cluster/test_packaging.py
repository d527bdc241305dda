"""What gets installed: one package, and every public name where fabric says it is.

Installed, the project is the one package ``fabric`` (``broker/`` and ``workers/`` become
``fabric.broker`` and ``fabric.workers``), and every public name loads from the module
``fabric/__init__`` names. What broker and worker processes load: ``test_layering``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]



@pytest.mark.timeout(180)
def test_the_wheel_installs_fabric_alone(tmp_path: Path) -> None:
    source = tmp_path / "src"  # (a copy: building leaves build/ and egg-info behind)
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, capture_output=True, timeout=170)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"fabric"}
    for module in ("fabric/broker/server.py", "fabric/workers/control_io.py",
                   "fabric/workers/backends/numpy_backend.py", "fabric/core/protocol.py",
                   "fabric/arrays/tensor.py", "fabric/transport/bulk.py", "fabric/mesh/sharded.py",
                   "fabric/graphs/function.py", "fabric/client/session.py",
                   "fabric/launch/local.py", "fabric/cli/main.py", "fabric/api.py",
                   "fabric/broker/dashboard.html"):  # (package data: the dashboard's page)
        assert module in names


def test_every_public_name_loads_from_its_module() -> None:
    # (fabric/__init__ names each public name's module; a wrong entry fails only when used)
    import fabric
    import fabric.graphs.capture  # a submodule named like a public name would now shadow it

    for name in fabric.__all__:
        value = getattr(fabric, name)
        assert name.isupper() or value.__name__ == name, name  # (constants have no __name__)
    assert callable(fabric.capture) and fabric.capture is fabric.graphs.capture.capture
