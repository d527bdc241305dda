"""How fast this machine gives a process memory it has not touched yet, the floor of every
first transfer: a fresh process maps new memory (``fabric.core.cross_memory.new_memory``)
and fills it itself ("local": a copy on the copy threads, as ``bench/first_transfer.py``'s
"new memory"), or another process writes it (``cross_memory.write``: "written", as a worker
writes a first read); in a process that holds nothing else, and in one that first touched
some GiB of its own.

    python bench/new_memory.py                     # 512 MiB, holding 0 and 3 GiB, 6 runs
    python bench/new_memory.py --mib 256 --hold 0,1,4 --runs 8

Each run is a fresh process making both, in turn (which goes first alternates); prints the
medians and ranges in ms. On a VM whose balloon hands freed memory back to its host, memory
the guest handed back faults in several times slower than memory it still holds, and which
one an allocation gets is chance, the more so the more the process holds
(``docs/operations.md``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fabric.core import cross_memory  # noqa: E402
from fabric.core.parallel_copy import ParallelCopy  # noqa: E402
from bench.first_transfer import free_page_reporting  # noqa: E402

GiB = 1 << 30
WAYS = ("local", "written")


def one_run(source: np.ndarray, hold: float, local_first: bool) -> dict[str, float]:
    """Milliseconds of filling new memory of ``source``'s size each way, in a fresh child
    process that first touched ``hold`` GiB of its own."""
    ways = WAYS if local_first else WAYS[::-1]
    child_reads, parent_writes = os.pipe()
    parent_reads, child_writes = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: it makes the memory, and fills it itself or has it written)
        os.close(parent_writes)
        os.close(parent_reads)
        try:
            held = cross_memory.new_memory(int(hold * GiB))
            np.frombuffer(held, np.uint8)[::4096] = 1
            copies = ParallelCopy()
            for way in ways:
                memory = cross_memory.new_memory(source.nbytes)
                target = np.frombuffer(memory, np.uint8)
                if way == "local":
                    start = time.perf_counter()
                    copies.copy(target, source)
                    os.write(child_writes, b"%f" % (time.perf_counter() - start))
                else:
                    os.write(child_writes, b"%d" % target.ctypes.data)
                os.read(child_reads, 1)  # (the parent read it, or wrote it)
        finally:
            os._exit(0)  # (having failed, it wrote nothing more: the parent reads an end)
    os.close(child_reads)  # (the child's ends: its exit ends the parent's reads)
    os.close(child_writes)
    copies = ParallelCopy()
    try:
        seconds = {}
        for way in ways:
            answer = os.read(parent_reads, 64)
            if not answer:
                raise RuntimeError("the child process ended early (out of memory?)")
            if way == "local":
                seconds[way] = float(answer)
            else:
                start = time.perf_counter()
                cross_memory.write(pid, int(answer), source, copies)
                seconds[way] = time.perf_counter() - start
            os.write(parent_writes, b".")
        return {way: value * 1e3 for way, value in seconds.items()}
    finally:
        copies.close()
        os.close(parent_writes)  # (first: a child still waiting then reads an end, and ends)
        os.close(parent_reads)
        os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="new memory per fill (512)")
    parser.add_argument("--hold", default="0,3",
                        help="GiB the process touches first, comma separated (0,3)")
    parser.add_argument("--runs", type=int, default=6, help="fresh processes per hold (6)")
    args = parser.parse_args()
    source = np.ones(args.mib << 20, np.uint8)
    print(f"{args.mib} MiB of new memory filled: medians of {args.runs} runs, ms [range]")
    for hold in (float(value) for value in args.hold.split(",")):
        figures: dict[str, list[float]] = {way: [] for way in WAYS}
        for run in range(args.runs):
            for way, value in one_run(source, hold, local_first=run % 2 == 0).items():
                figures[way].append(value)
        print(f"holding {hold:g} GiB: " + "   ".join(
            f"{way} {statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"
            for way, values in figures.items()))
    print(free_page_reporting())


if __name__ == "__main__":
    main()
