"""CPU time the processes of a target spend, for "CPU-seconds per 1,000 streamed tokens".

Read from ``/proc/<pid>/stat`` (user + system time of a process and, recursively, its
children: a supervised worker is a supervisor with the worker beneath it). Linux only; where
``/proc`` is missing every reading is 0 and the benchmark reports no CPU figures.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found.extend(int(child) for child in task.read_text().split())
        except (OSError, ValueError):
            continue
    return found


def process_tree_cpu_s(pid: int, skip: frozenset[int] = frozenset()) -> float:
    """User + system seconds of `pid` and its living descendants, leaving out the trees of
    those in `skip` (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime
    children = [child for child in _children(pid) if child not in skip]
    return own + sum(process_tree_cpu_s(child, skip) for child in children)


def cpu_snapshot(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process tree; a process named in its own right (a
    worker the controller spawned) counts under its name, not under its parent's."""
    named = frozenset(pids.values())
    return {name: process_tree_cpu_s(pid, named - {pid}) for name, pid in pids.items()}


def cpu_per_1k_tokens(
    before: Mapping[str, float], after: Mapping[str, float], tokens: int
) -> dict[str, float]:
    """CPU seconds each process tree spent between two snapshots, per 1,000 tokens."""
    if tokens <= 0:
        return {}
    return {name: (after[name] - before.get(name, 0.0)) * 1000 / tokens for name in after}


def _replica_id(pid: int) -> str | None:
    """`LLMQ_REPLICA_ID` of a process the controller spawned (None: not a replica)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"LLMQ_REPLICA_ID="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def dev_stack_pids() -> dict[str, int]:
    """The local stack's processes by part name (gateway, controller, tansu, valkey ...),
    and each worker replica the controller spawned as `worker:<replica id>`."""
    from llmq.devstack import read_state

    pids = {part.name: part.pid for part in read_state() or []}
    controller = pids.get("controller")
    for child in _children(controller) if controller is not None else []:
        replica = _replica_id(child)
        if replica is not None:
            pids[f"worker:{replica}"] = child
    return pids
