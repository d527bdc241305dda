"""What gets installed, and what a broker or worker loads.

Installed, the project is the one package ``fabric`` (``broker/`` and ``workers/`` become
``fabric.broker`` and ``fabric.workers``), and the broker and worker processes import only the
sans-I/O core besides their own modules: never the client, the cluster launcher or asyncio.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLIENT_SIDE = ("fabric.client", "fabric.tensor", "fabric.graph", "fabric.cluster", "fabric.cli",
               "fabric.admin", "fabric.trace", "fabric.demo", "fabric.session", "fabric.connection",
               "fabric.arrays", "fabric.stream", "fabric.numpy_functions", "fabric.random",
               "fabric.origins", "fabric.device", "asyncio")


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
    for module in ("fabric/broker/server.py", "fabric/workers/worker.py",
                   "fabric/workers/backends/numpy_backend.py"):
        assert module in names


@pytest.mark.parametrize("module", ["fabric.broker.server", "fabric.workers.worker"])
def test_brokers_and_workers_load_no_client(module: str) -> None:
    probe = (f"import sys, {module}; "
             f"print(sorted(m for m in sys.modules if m.startswith({CLIENT_SIDE!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_public_name_loads_from_its_module() -> None:
    # (fabric/__init__ names each public name's module; a wrong entry fails only when used)
    import fabric
    import fabric.trace  # a submodule named like a public name would now shadow it

    for name in fabric.__all__:
        value = getattr(fabric, name)
        assert name.isupper() or value.__name__ == name, name  # (constants have no __name__)
    assert callable(fabric.capture) and fabric.capture is fabric.trace.capture
