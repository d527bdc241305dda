"""docs/ops.md, the page of what runs on a device, is what docs/ops_page.py makes of the op
table and of the registries of numpy's functions on tensors today: a change to either shows
on the page, or this fails, saying how to write it again."""

from __future__ import annotations

import runpy
from pathlib import Path

MAKER = Path(__file__).resolve().parents[2] / "docs" / "ops_page.py"


def test_the_page_of_what_runs_on_a_device_is_the_tables():
    maker = runpy.run_path(str(MAKER))
    assert maker["PAGE"].read_text() == maker["page"](), \
        "docs/ops.md is stale: write it again with .venv/bin/python docs/ops_page.py"
