"""Not the fabric package: the root of a clone of its repository (the ``fabric-arrays``
distribution), which Python imports as ``fabric`` when a script runs in the folder above a
clone named ``fabric`` (git's default name for it).

Rule: this file only hands over. Imported as ``fabric``, it puts the installed package (the
one ``import fabric`` finds without the folder above on the path: a wheel's, or an editable
install of this clone or another) in its own place, so the script gets it; with none
installed it raises ImportError naming this folder. Imported under any other name (a tool
walking the clone), it does nothing. Without it the clone's root was a namespace package that
hid an editable install: ``fabric.connect`` an AttributeError, with no hint.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec


def _through_here(entry: str) -> bool:
    """Whether path entry ``entry`` finds this file as ``fabric/__init__.py``."""
    found = os.path.join(entry or os.curdir, "fabric", "__init__.py")
    try:
        return os.path.samefile(found, __file__)
    except OSError:
        return False


def _installed() -> ModuleSpec | None:
    """The spec of the package ``import fabric`` finds past this clone's root, or None."""
    path = [entry for entry in sys.path if not _through_here(entry)]
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec("fabric", path) if find_spec is not None else None
        # (a namespace package has no location: another such folder, not a package)
        if spec is not None and spec.has_location and spec.loader is not None:
            return spec
    return None


if __name__ == "fabric":
    _spec = _installed()
    if _spec is None:
        _here = os.path.dirname(os.path.abspath(__file__))
        raise ImportError(
            f"{_here} is a clone of fabric's repository, not the fabric package: Python found "
            f"it because your script runs in {os.path.dirname(_here)}, and no fabric is "
            f"installed. Install it (pip install -e {_here}, or pip install fabric-arrays), "
            "or run the script from another folder.", name="fabric", path=__file__)
    # The installed package takes this module's place: the import system hands the caller
    # whatever sys.modules holds under the name once this file has run.
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["fabric"] = _module
    _spec.loader.exec_module(_module)
