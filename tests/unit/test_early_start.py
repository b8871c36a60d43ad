"""An interactive job's prefill starts before its checks return; stopped, the engine aborts it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from schemas.messages import InferenceJob, SamplingSettings
from workers.early_start import EarlyStart
from workers.engine.port import EngineStep


def _step(text: str, finished: bool = False) -> EngineStep:
    return EngineStep(text=text, num_new_tokens=1, prompt_tokens=3, cached_tokens=0,
                      finished=finished)  # fmt: skip


class GatedEngine:
    """Yields its steps once `go` is set; records what was started, closed and aborted."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.go = asyncio.Event()
        self.started: list[str] = []
        self.closed: list[str] = []
        self.aborted: list[str] = []

    async def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        self.started.append(job.request_id)
        try:
            await self.go.wait()
            for i, text in enumerate(self.texts):
                yield _step(text, finished=i == len(self.texts) - 1)
        finally:
            self.closed.append(job.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _job(request_id: str) -> InferenceJob:
    return InferenceJob(
        request_id=request_id, team="t", model="m", pool="p", reply_to="r",
        prompt_token_ids=[1, 2, 3], sampling=SamplingSettings(max_tokens=3), created_at=0.0,
        deadline=60.0,
    )  # fmt: skip


async def test_the_engine_starts_before_the_steps_are_read_and_none_is_lost() -> None:
    engine = GatedEngine(["a", "b", "c"])
    early = EarlyStart.of(engine, _job("r1"))
    await asyncio.sleep(0)  # one turn of the loop: the first step is being awaited
    assert engine.started == ["r1"]
    engine.go.set()
    assert [step.text async for step in early.steps()] == ["a", "b", "c"]
    assert engine.aborted == []


async def test_stopping_aborts_the_run_in_the_engine() -> None:
    engine = GatedEngine(["a"])
    early = EarlyStart.of(engine, _job("r2"))
    await asyncio.sleep(0)
    await early.stop(engine)
    assert engine.closed == ["r2"] and engine.aborted == ["r2"]


async def test_a_run_that_ends_without_a_step_yields_nothing() -> None:
    engine = GatedEngine([])
    engine.go.set()
    early = EarlyStart.of(engine, _job("r3"))
    assert [step async for step in early.steps()] == []
    await early.stop(engine)  # stopping a finished run is harmless
    assert engine.aborted == ["r3"]
