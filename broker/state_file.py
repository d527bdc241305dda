"""The broker's state file (``fabric broker --state-file``): its device numbering kept across
restarts, so that a device's index outlives the broker process too.

Rule: thin I/O around ``WorkerTable.state()`` and ``restore``: read once before the broker
serves (a file that is not one the broker wrote stops it, with a sentence saying so), written
whole and atomically (``config.write_secret_file``: a temporary file renamed into place,
mode 0600) by the I/O loop after each batch that changed the numbering. A missing file is a
fresh start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fabric.core.config import write_secret_file
from fabric.core.errors import ConfigError

from .worker_table import WorkerTable


class StateFile:
    """``path``, holding ``table``'s numbering."""

    def __init__(self, path: str | os.PathLike[str], table: WorkerTable) -> None:
        self.path = Path(path)
        self.table = table
        self.saved = -1  # the table's revision last written

    def load(self) -> None:
        """Restore the numbering the file holds, if it exists."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigError(f"Cannot read the state file {self.path}: {exc.strerror}.") from None
        try:
            self.table.restore(json.loads(text))
        except ValueError as exc:  # (json's errors are ValueErrors too)
            raise ConfigError(f"The state file {self.path} cannot be used: {exc}. Give "
                              "another --state-file, or remove this one to number devices "
                              "afresh.") from None
        self.saved = self.table.revision

    def save_if_changed(self) -> None:
        """Write the numbering if it changed since last written."""
        if self.table.revision != self.saved:
            write_secret_file(self.path, json.dumps(self.table.state()))
            self.saved = self.table.revision
