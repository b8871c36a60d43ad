"""An interactive job's prefill, started while its start checks are still in Redis.

A job's start checks (finished before? cancelled? an earlier run's attempt record) take a
round trip to Redis, a few milliseconds on a busy machine, and nearly always say "run it". So
the worker hands an interactive job to the engine at once and, meanwhile, awaits the checks:
the prefill, the longest part of the time to first token, overlaps them. Nothing the engine
produces is published before the checks pass; when they say otherwise (a re-delivered job
that already finished, a cancelled one) the early run is aborted, at the cost of part of one
prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from schemas.messages import InferenceJob
from workers.engine.port import EngineStep


class _Engine(Protocol):
    def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]: ...

    async def abort(self, request_id: str) -> None: ...


class EarlyStart:
    """The engine's stream of one job, its first step already being awaited in a task."""

    def __init__(self, request_id: str, steps: AsyncIterator[EngineStep]) -> None:
        self._request_id = request_id
        self._steps = steps
        self._first: asyncio.Task[EngineStep] = asyncio.ensure_future(anext(steps))

    @classmethod
    def of(cls, engine: _Engine, job: InferenceJob) -> EarlyStart:
        return cls(job.request_id, engine.generate(job))

    async def steps(self) -> AsyncIterator[EngineStep]:
        """Every step of the job, the first one included (to be read once)."""
        try:
            first = await self._first
        except StopAsyncIteration:
            return
        yield first
        async for step in self._steps:
            yield step

    async def stop(self, engine: _Engine) -> None:
        """Abort the run: the job ends before the engine may produce for it."""
        self._first.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await self._first
        aclose = getattr(self._steps, "aclose", None)
        if aclose is not None:
            await aclose()
        await engine.abort(self._request_id)
