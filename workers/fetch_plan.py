"""Which partitions to fetch from, and how many records, given what can start: pure logic.

Interactive work is fetched up to what can start now plus a small look-ahead (so that, when a
slot frees, the fair queue chooses between teams instead of taking whichever partition the
broker returns first). Once nothing more can start, a partition that already has a job
buffered pauses and every other one stays open (past the look-ahead, one record per fetch): a
buffer full of one team's jobs waiting for that team's share never hides another team's new
job behind them (a job can only be chosen once fetched), and the buffer holds at most one job
per partition beyond the look-ahead. A partition whose held job waits only because its team is
at its share stays open too (the caller leaves it out of ``waiting_in``), up to
``most_buffered`` jobs in all: a flood spread over many partitions cannot hide a steady team's
job behind its own.
Batch work is fetched only as far as its budget allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from workers.headroom import FetchBudget

P = TypeVar("P")  # a partition (aiokafka's TopicPartition in the worker)
R = TypeVar("R")


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
    most_buffered: int | None = None,
) -> FetchPlan[P]:
    """``partitions``: the assigned partitions by class; ``waiting_in``: those with a job held
    (buffered or waiting to start) in this worker that should pause them; ``most_buffered``:
    the most interactive jobs held before every interactive partition pauses."""
    can_start = budget.interactive - held_interactive
    want = {
        "interactive": budget.interactive + lookahead - held_interactive,
        "batch": budget.batch - held_batch,
    }
    pause: set[P] = set()
    resume: set[P] = set()
    most = 0
    for cls, assigned in partitions.items():
        full = most_buffered is not None and held_interactive >= most_buffered
        if cls == "interactive" and can_start <= 0 and full:
            pause.update(assigned)
        elif cls == "interactive" and can_start <= 0:  # look-ahead: one job per partition
            opened = {tp for tp in assigned if tp not in waiting_in}
            pause.update(tp for tp in assigned if tp in waiting_in)
            resume.update(opened)
            most = max(most, max(want[cls], 1) if opened else 0)
        elif want.get(cls, 0) <= 0:
            pause.update(assigned)
        else:
            resume.update(assigned)
            most = max(most, want[cls])
    return FetchPlan(frozenset(pause), frozenset(resume), most)


async def wake_during(
    fetch: Awaitable[R],
    wake: asyncio.Event,
    on_wake: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
) -> R:
    """Await a fetch; each time `wake` is set meanwhile (a slot freed), clear it and run
    `on_wake` (start a held job now, not when the fetch returns, up to its timeout later).
    The fetch is never cancelled, so no record it took is lost."""
    task = asyncio.ensure_future(fetch)
    while not task.done():
        woken = asyncio.ensure_future(wake.wait())
        await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
        if not woken.done():
            woken.cancel()
            continue
        wake.clear()
        if not stopping.is_set():
            await on_wake()
    return await task
