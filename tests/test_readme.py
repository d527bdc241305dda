"""The README's commands, run exactly as written, each in a fresh shell.

Every code block of README.md that holds commands is preceded by a marker comment, which
rendered Markdown does not show:

- ``<!-- readme-test: install -->``: the install step. It is not run (a fresh venv and an
  install take minutes); the repository's own ``.venv``, which the same command made, stands
  for it, and the blocks run in a scratch folder whose ``.venv`` links to it: where the
  README's install step would have put it.
- ``<!-- readme-test: run -->``: run to completion, within ``RUN_TIMEOUT``; it must exit 0.
  A ``sh`` block runs as ``bash -e -o pipefail -c BLOCK`` (its first command that fails
  fails it, as a user would stop there); a ``python`` block is fed to ``.venv/bin/python``,
  as a user pastes it.
- ``<!-- readme-test: background, ready at "TEXT" -->``: a command a user leaves running in
  its own shell (a cluster, a broker, a worker); started in the background, and ready once
  TEXT appears in its output (within ``READY_TIMEOUT``). It runs until its section (the text
  up to the next heading) ends; then it is stopped as Ctrl-C stops it, and killed with its
  whole process group if that does not end it, even when the test fails.
- ``<!-- readme-test: skip, REASON -->``: not run, for the reason given (the whole suite,
  benchmarks, fragments with placeholders).

Every shell a block runs in is fresh: ``bash -c`` with a clean environment (PATH, a scratch
HOME, LANG) and no activation beyond what the README shows. Each section is one test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
RUN_TIMEOUT = 120.0  # seconds one block may take (the demo is the longest, a few seconds)
READY_TIMEOUT = 60.0  # seconds a background command may take to be ready
STOP_TIMEOUT = 15.0  # seconds a background command may take to stop on Ctrl-C
MARKER = re.compile(r'<!-- readme-test: (install|run|background|skip)(?:, ready at "([^"]*)")?'
                    r'[^>]*-->\n```(\w+)\n(.*?)\n```', re.S)


class Block(NamedTuple):
    section: str  # the heading above it
    how: str  # install, run, background or skip
    ready_at: str  # for a background block: what its output says once it is ready
    language: str  # sh or python
    text: str


def readme_blocks() -> list[Block]:
    """Every marked block of the README, in order, with its section's heading."""
    text = README.read_text()
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)]
    return [Block(next(h for start, h in reversed(headings) if start < m.start()),
                  m.group(1), m.group(2) or "", m.group(3), m.group(4))
            for m in MARKER.finditer(text)]


def sections_to_run() -> list[str]:
    return list(dict.fromkeys(b.section for b in readme_blocks()
                              if b.how in ("run", "background")))


def test_every_command_block_of_the_readme_is_marked():
    """A new command block cannot escape this test unnoticed: run it or say why not."""
    fences = re.findall(r"^```(sh|python)$", README.read_text(), re.M)
    assert len(readme_blocks()) == len(fences)


@pytest.fixture
def fresh_shell(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A scratch folder standing for the repository root after the install step (its .venv
    is the repository's), and a clean environment with a scratch HOME."""
    work, home = tmp_path / "checkout", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    venv = REPO / ".venv"
    assert (venv / "bin" / "fabric").exists(), "the README's install step made .venv here"
    (work / ".venv").symlink_to(venv)
    return work, {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
                  "LANG": "C.UTF-8"}


def _command(block: Block) -> list[str]:
    if block.language == "python":
        return ["bash", "-c", ".venv/bin/python -"]  # the block arrives on stdin
    return ["bash", "-e", "-o", "pipefail", "-c", block.text]


def _run(block: Block, work: Path, env: dict[str, str]) -> None:
    done = subprocess.run(_command(block), cwd=work, env=env, text=True,
                          input=block.text if block.language == "python" else None,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 0, f"{block.text}\nexited {done.returncode}:\n{done.stdout}"


def _start(block: Block, work: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a background block in a process group of its own; wait until it is ready."""
    with open(log, "w") as out:
        proc = subprocess.Popen(_command(block), cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT
    while block.ready_at not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"{block.text}\nwas not ready ({block.ready_at!r}):\n{log.read_text()}")
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C for the block's whole process group; SIGKILL for it if that does not end it."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass  # the group is gone
        try:
            proc.wait(STOP_TIMEOUT)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.timeout(600)
@pytest.mark.parametrize("section", sections_to_run())
def test_the_readme_section_runs_as_written(section, fresh_shell, tmp_path):
    work, env = fresh_shell
    running: list[subprocess.Popen] = []
    try:
        for n, block in enumerate(b for b in readme_blocks() if b.section == section):
            if block.how == "run":
                _run(block, work, env)
            elif block.how == "background":
                running.append(_start(block, work, env, tmp_path / f"background-{n}.log"))
    finally:
        for proc in reversed(running):
            _stop(proc)
