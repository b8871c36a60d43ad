"""Fetch planning: what can start, plus a look-ahead that never hides another team's job."""

from __future__ import annotations

import asyncio

from workers.fetch_plan import plan_fetch, wake_during
from workers.headroom import FetchBudget

PARTITIONS = {"interactive": ["i0", "i1", "i2"], "batch": ["b0", "b1"]}


def test_room_to_start_opens_everything_it_can_use() -> None:
    plan = plan_fetch(
        FetchBudget(interactive=3, batch=2), held_interactive=0, held_batch=0, lookahead=2,
        partitions=PARTITIONS, waiting_in=set(),
    )  # fmt: skip
    assert plan.resume == {"i0", "i1", "i2", "b0", "b1"} and not plan.pause
    assert plan.max_records == 5


def test_a_full_buffer_pauses_only_the_partitions_it_holds_jobs_from() -> None:
    # One team's jobs from i0 wait for its share: i1 and i2 stay open for other teams.
    plan = plan_fetch(
        FetchBudget(interactive=2, batch=0), held_interactive=6, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in={"i0"},
    )  # fmt: skip
    assert plan.pause == {"i0", "b0", "b1"} and plan.resume == {"i1", "i2"}
    assert plan.max_records == 1


def test_no_slot_keeps_every_partition_without_a_held_job_open() -> None:
    plan = plan_fetch(
        FetchBudget(interactive=0, batch=0), held_interactive=1, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in={"i0"},
    )  # fmt: skip
    assert plan.pause == {"i0", "b0", "b1"} and plan.resume == {"i1", "i2"}
    assert plan.max_records == 3
    # The look-ahead is spent (a flooding team's jobs wait for its share), yet a partition
    # holding none of them stays open: another team's job there is fetched, not hidden.
    full = plan_fetch(
        FetchBudget(interactive=0, batch=0), held_interactive=4, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in={"i0", "i1"},
    )  # fmt: skip
    assert full.pause == {"i0", "i1", "b0", "b1"} and full.resume == {"i2"}
    assert full.max_records == 1
    every = plan_fetch(
        FetchBudget(interactive=0, batch=0), held_interactive=3, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in={"i0", "i1", "i2"},
    )  # fmt: skip
    assert every.pause == {"i0", "i1", "i2", "b0", "b1"} and every.max_records == 0


def test_a_full_buffer_pauses_every_interactive_partition() -> None:
    # Partitions whose held jobs wait for their team's share stay open (the caller leaves
    # them out of waiting_in), but never past the buffer's bound.
    open_ = plan_fetch(
        FetchBudget(interactive=0, batch=0), held_interactive=5, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in=set(), most_buffered=6,
    )  # fmt: skip
    assert open_.resume == {"i0", "i1", "i2"} and open_.max_records == 1
    full = plan_fetch(
        FetchBudget(interactive=0, batch=0), held_interactive=6, held_batch=0, lookahead=4,
        partitions=PARTITIONS, waiting_in=set(), most_buffered=6,
    )  # fmt: skip
    assert full.pause == {"i0", "i1", "i2", "b0", "b1"} and full.max_records == 0


async def test_a_slot_freeing_during_a_fetch_starts_work_at_once_and_keeps_the_fetch() -> None:
    records: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    wake, stopping, acted = asyncio.Event(), asyncio.Event(), asyncio.Event()
    started: list[bool] = []

    async def on_wake() -> None:
        started.append(records.done())  # runs while the fetch is still waiting
        acted.set()

    fetching = asyncio.create_task(wake_during(records, wake, on_wake, stopping))
    for _ in range(2):  # two slots free, one after the other
        acted.clear()
        wake.set()
        await acted.wait()
    assert not fetching.done()
    records.set_result([7])
    assert await fetching == [7]  # the fetch was awaited to its end, never cancelled
    assert started == [False, False]


def test_the_worker_builds_a_simulated_engine_when_told_to() -> None:
    from workers.engine.simulated import SimulatedGpuEngine
    from workers.main import build_engine
    from workers.settings import WorkerSettings

    settings = WorkerSettings(
        engine="simulated", sim_model="llama-3-70b", sim_tensor_parallel=4, max_num_seqs=32
    )
    engine = build_engine(settings)
    assert isinstance(engine, SimulatedGpuEngine)
    assert engine.max_num_seqs == 32 and engine.profile.tensor_parallel == 4
    assert engine.stats().prefill_tokens_per_s > 10_000  # 4 H100s at 40% of peak
