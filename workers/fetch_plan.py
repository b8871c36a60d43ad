"""Which partitions to fetch from, and how many records, given what can start: pure logic.

Interactive work is fetched up to what can start now plus a small look-ahead (so that, when a
slot frees, the fair queue chooses between teams instead of taking whichever partition the
broker returns first). In look-ahead, a partition that already has a job buffered pauses and
the others stay open: a buffer full of one team's jobs waiting for that team's share never
hides another team's new job, and the buffer holds at most one job per open partition.
Batch work is fetched only as far as its budget allows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from workers.headroom import FetchBudget

P = TypeVar("P")  # a partition (aiokafka's TopicPartition in the worker)


@dataclass(frozen=True)
class FetchPlan(Generic[P]):
    pause: frozenset[P]
    resume: frozenset[P]
    max_records: int
    """0: do not fetch at all."""


def plan_fetch(
    budget: FetchBudget,
    *,
    held_interactive: int,
    held_batch: int,
    lookahead: int,
    partitions: Mapping[str, Collection[P]],
    waiting_in: Collection[P],
) -> FetchPlan[P]:
    """``partitions``: the assigned partitions by class; ``waiting_in``: those with a job held
    (buffered or waiting to start) in this worker."""
    can_start = budget.interactive - held_interactive
    want = {
        "interactive": budget.interactive + lookahead - held_interactive,
        "batch": budget.batch - held_batch,
    }
    pause: set[P] = set()
    resume: set[P] = set()
    looking_ahead = False
    for cls, assigned in partitions.items():
        look_ahead_only = min(can_start, want[cls]) <= 0 and (
            want[cls] > 0 or budget.interactive > 0
        )
        if cls == "interactive" and look_ahead_only:
            opened = {tp for tp in assigned if tp not in waiting_in}
            pause.update(tp for tp in assigned if tp in waiting_in)
            resume.update(opened)
            looking_ahead = looking_ahead or bool(opened)
        elif want.get(cls, 0) <= 0:
            pause.update(assigned)
        else:
            resume.update(assigned)
    most = max(*want.values(), 1 if looking_ahead else 0)
    return FetchPlan(frozenset(pause), frozenset(resume), max(most, 0))
