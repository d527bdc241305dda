"""The commands of the README and of every page of docs/ (and CONTRIBUTING.md), run exactly
as written, each in a fresh shell.

Every code block of those pages that holds commands is preceded by a marker comment, which
rendered Markdown does not show:

- ``<!-- readme-test: install -->``: the install step. It is not run (a fresh venv and an
  install take minutes); the repository's own ``.venv``, which the same command made, stands
  for it, and the blocks run in a scratch folder whose ``.venv`` links to it: where the
  README's install step would have put it.
- ``<!-- readme-test: install, then run -->``: the install step (``INSTALL``), then ``&&``
  and a command: the install stands as above, and the command is run as a ``run`` block.
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
HOME, LANG) and no activation beyond what the page shows. Each section of each page is one
test. The README's test command is the one ``.ci/run`` runs, and no page links outside the
repository (``../shared/``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from polling import poll

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# Every page whose commands run as written: the README, CONTRIBUTING.md and docs/.
PAGES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
README_MOST_LINES = 200  # a front door: the rest is in docs/
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
TEST_COMMAND = f"{INSTALL} && .venv/bin/python -m pytest"  # .ci/run's last line
RUN_TIMEOUT = 120.0  # seconds one block may take (the demo is the longest, a few seconds)
READY_TIMEOUT = 60.0  # seconds a background command may take to be ready
STOP_TIMEOUT = 15.0  # seconds a background command may take to stop on Ctrl-C
MARKER = re.compile(r'<!-- readme-test: (install(?:, then run)?|run|background|skip)'
                    r'(?:, ready at "([^"]*)")?[^>]*-->\n```(\w+)\n(.*?)\n```', re.S)


class Block(NamedTuple):
    section: str  # the heading above it
    how: str  # install, run, background or skip
    ready_at: str  # for a background block: what its output says once it is ready
    language: str  # sh or python
    text: str


def _block(section: str, marker: re.Match) -> Block:
    how, ready_at, language, text = marker.groups()
    if how == "install, then run":  # the install stands as for an install block
        assert text.startswith(f"{INSTALL} && "), f"not the install step, then a command: {text}"
        how, text = "run", text[len(INSTALL) + len(" && "):]
    return Block(section, how, ready_at or "", language, text)


def page_blocks(page: Path) -> list[Block]:
    """Every marked block of a page, in order, with its section's heading."""
    text = page.read_text()
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)]
    return [_block(next(h for start, h in reversed(headings) if start < m.start()), m)
            for m in MARKER.finditer(text)]


def sections_to_run() -> list[tuple[str, str]]:
    """(page, section) for each section of each page with a block to run."""
    return list(dict.fromkeys((str(page.relative_to(REPO)), b.section) for page in PAGES
                              for b in page_blocks(page) if b.how in ("run", "background")))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_command_block_of_every_page_is_marked(page):
    """A new command block cannot escape this test unnoticed: run it or say why not."""
    fences = re.findall(r"^```(sh|python)$", page.read_text(), re.M)
    assert len(page_blocks(page)) == len(fences)


def test_the_readme_is_a_front_door_with_the_set_up_commands_at_its_top():
    """At most README_MOST_LINES lines; its first two commands run the demo and the tests, and
    the test command is the one CI runs."""
    text = README.read_text()
    assert len(text.splitlines()) <= README_MOST_LINES
    first_two = [m.group(4) for m in MARKER.finditer(text.split("\n## ", 1)[0])][:2]
    assert first_two == [f"{INSTALL} && .venv/bin/fabric demo", TEST_COMMAND]
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text().splitlines()


def _anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer gives the page's headings, as GitHub spells them."""
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", page.read_text(), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_link_of_every_page_stays_in_the_repository_and_finds_its_place(page):
    """A relative link names a file of this repository (../shared/ is outside any clone), and a
    heading there if it names one."""
    text = page.read_text()
    assert "../shared" not in text
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target:
            continue
        path = (page.parent / target).resolve() if target else page  # (#anchor: this page)
        assert path.is_relative_to(REPO) and path.exists(), f"{page.name} links {target}"
        if anchor:
            assert anchor in _anchors(path), f"{page.name} links {target}#{anchor}"


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

    def ready() -> bool:
        return block.ready_at in log.read_text()
    poll(lambda: ready() or proc.poll() is not None, READY_TIMEOUT, 0.1)  # (or it ended)
    if not ready():
        _stop(proc)
        pytest.fail(f"{block.text}\nwas not ready ({block.ready_at!r}):\n{log.read_text()}")
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
@pytest.mark.parametrize("page, section", sections_to_run())
def test_the_section_runs_as_written(page, section, fresh_shell, tmp_path):
    work, env = fresh_shell
    running: list[subprocess.Popen] = []
    try:
        for n, block in enumerate(b for b in page_blocks(REPO / page) if b.section == section):
            if block.how == "run":
                _run(block, work, env)
            elif block.how == "background":
                running.append(_start(block, work, env, tmp_path / f"background-{n}.log"))
    finally:
        for proc in reversed(running):
            _stop(proc)
