"""The worker's one options record: ``fabric worker`` and ``serve()`` start from the same
defaults, and the record is read once, at its making."""

from __future__ import annotations

import dataclasses

import pytest

from fabric.cli.main import worker as worker_command
from fabric.core.errors import ConfigError
from fabric.core.parallel_copy import MIN_BYTES_ENV, THREADS_ENV
from fabric.core.worker_options import (DEFAULT_MEMORY_BUDGET, NUMEXPR_MIN_SIZE_ENV,
                                        WorkerOptions)
from fabric.workers.backends.numexpr_backend import NumexprDevice

# The command's options whose default reads another way in the record: (record field, the
# command's default as the record writes it)
_SPELLED_OTHERWISE = {"no_shared_memory": ("shared_memory", True)}


def test_the_command_and_the_record_have_the_same_defaults(monkeypatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv(MIN_BYTES_ENV, raising=False)
    record = WorkerOptions(token="t", name="n")
    fields = {f.name for f in dataclasses.fields(WorkerOptions)}
    compared = set()
    for param in worker_command.params:
        name, default = _SPELLED_OTHERWISE.get(param.name, (param.name, param.default))
        if name not in fields or name in ("token", "name"):
            continue
        compared.add(name)
        if name == "memory_budget":
            assert default == DEFAULT_MEMORY_BUDGET
        elif name != "copy_threads":  # (the command's None: the record's default_threads())
            assert getattr(record, name) == default, name
    # every field is one of the command's options, but the credentials and the environment's
    # tuning knobs (FABRIC_PARALLEL_COPY_BYTES, FABRIC_NUMEXPR_MIN_SIZE)
    assert compared == fields - {"token", "name", "curve", "copy_min_bytes", "numexpr_min_size"}


def test_the_environment_is_read_as_the_record_is_made_and_never_after(monkeypatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "3")
    monkeypatch.setenv(MIN_BYTES_ENV, "0")
    record = WorkerOptions(token="t", name="n")
    monkeypatch.setenv(THREADS_ENV, "1")
    assert (record.copy_threads, record.copy_min_bytes) == (3, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.copy_threads = 1  # type: ignore[misc]


def test_a_numexpr_bound_that_is_no_count_is_refused_as_the_record_is_made(monkeypatch):
    monkeypatch.setenv(NUMEXPR_MIN_SIZE_ENV, "lots")
    with pytest.raises(ConfigError, match="FABRIC_NUMEXPR_MIN_SIZE='lots' is not a whole"):
        WorkerOptions(token="t", name="n")
    monkeypatch.setenv(NUMEXPR_MIN_SIZE_ENV, "0")
    assert NumexprDevice.for_worker(0, WorkerOptions(token="t", name="n")).min_size == 0
