"""CPU affinity on a machine whose engines run on its CPU: the engines' compute threads keep
their cores, everything else runs on the others.

A vLLM CPU engine binds each OpenMP compute thread to one core (`VLLM_CPU_OMP_THREADS_BIND`),
and Intel's OpenMP accepts only cores the process was started with ("Ignoring invalid OS proc
ID"), so an engine's process must start with every core and its other threads are moved off
the engine's cores afterwards: the serving front end (pull loop, token relay, detokenizing),
the engine's scheduler process and its I/O threads. A thread that may run on more than one
core is "floating"; a compute thread bound to one core is left where it is.

Linux only (``/proc`` and ``sched_setaffinity``); elsewhere every function does nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator
from pathlib import Path


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and Path("/proc/self/task").is_dir()


@contextlib.contextmanager
def pinned(cores: Collection[int] | None) -> Iterator[None]:
    """Run the block with this thread's CPU affinity set to `cores` (None or empty: as it is),
    then put it back: a process started inside inherits them."""
    if not cores or not supported():
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def process_tree(pid: int) -> list[int]:
    """`pid` and every live process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, frontier = [pid], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        tree.extend(children)
        frontier.extend(children)
    return tree


def pin_floating_threads(pid: int, cores: Collection[int]) -> int:
    """Move every floating thread of `pid` and its descendants onto `cores`; return how many
    moved. Threads bound to one core (an engine's compute threads) stay; a thread or process
    gone meanwhile is skipped."""
    if not cores or not supported():
        return 0
    target = set(cores)
    moved = 0
    for process in process_tree(pid):
        try:
            threads = [int(t.name) for t in Path(f"/proc/{process}/task").iterdir()]
        except OSError:
            continue
        for thread in threads:
            try:
                allowed = os.sched_getaffinity(thread)
                if len(allowed) > 1 and allowed != target:
                    os.sched_setaffinity(thread, target)
                    moved += 1
            except OSError:  # exited meanwhile
                continue
    return moved
