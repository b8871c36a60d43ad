"""The health probe runs only when no real job proves the engine works."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from schemas.messages import InferenceJob, SamplingSettings
from workers.engine.port import EngineStats, EngineStep
from workers.health import EngineHealth
from workers.load import LoadTracker


class CountingEngine:
    max_num_seqs = 4
    max_model_len = 128
    kv_capacity_tokens = 0

    def __init__(self) -> None:
        self.probes = 0
        self.probed = asyncio.Event()

    async def start(self) -> None:
        pass

    async def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        self.probes += 1
        self.probed.set()
        yield EngineStep("x", 1, 8, 0, True, "length")

    async def abort(self, request_id: str) -> None:
        pass

    def stats(self) -> EngineStats:
        return EngineStats()

    async def shutdown(self) -> None:
        pass


def _job(request_id: str) -> InferenceJob:
    return InferenceJob(
        request_id=request_id, team="t", model="m", pool="p", prompt_token_ids=(1,),
        sampling=SamplingSettings(max_tokens=50), created_at=0, deadline=1e12, reply_to="r",
    )  # fmt: skip


def _health(engine: CountingEngine, load: LoadTracker) -> EngineHealth:
    return EngineHealth(
        engine, load, replica_id="r", model="m", pool="p", interval_s=0.05, timeout_s=1
    )


async def test_a_busy_engine_producing_tokens_is_not_probed() -> None:
    engine, load = CountingEngine(), LoadTracker()
    health = _health(engine, load)
    load.started(_job("real"))
    load.produced("real", 1, 0)
    assert health.busy_and_progressing()
    watching = asyncio.create_task(health.watch())
    for _ in range(10):  # ten intervals of a streaming job: never probed
        load.produced("real", 1, 0)
        await asyncio.sleep(0.05)  # the job's own pace of tokens
    assert engine.probes == 0
    load.finished("real")  # idle again: the probe resumes
    await asyncio.wait_for(engine.probed.wait(), 5)
    watching.cancel()


async def test_an_idle_engine_is_probed() -> None:
    engine, load = CountingEngine(), LoadTracker()
    health = _health(engine, load)
    assert not health.busy_and_progressing()
    watching = asyncio.create_task(health.watch())
    await asyncio.wait_for(engine.probed.wait(), 5)
    watching.cancel()
