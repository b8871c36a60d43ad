"""SIMULATION: the simulated engine alone, so `llmq bench relay` can say what a worker spends
outside its engine.

A worker's CPU includes its engine's: the simulated engine's step loop and its hand-over of
every step to every sequence's stream, which any caller of the engine pays (the direct server
too, as every caller of vLLM's ``AsyncLLM.generate`` is handed each request's outputs). The
direct simulated server runs the same engine (same modelled GPU, model and slots) with N
callers that only drain their streams, back to back for a fixed time, and reports the CPU its
process spent per 1,000 tokens; the relay benchmark subtracts that from the worker's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import httpx
from pydantic import BaseModel, Field, PositiveInt

from workers.engine.simulated import SimulatedGpuEngine

PATH = "/bench/engine-alone"
"""The direct server's endpoint (POST an `EngineAloneRequest`, get an `EngineAloneResult`)."""


class EngineAloneRequest(BaseModel):
    streams: PositiveInt
    """Callers draining streams at once."""
    duration_s: float = Field(gt=0, le=600)
    max_tokens: PositiveInt
    prompt: str
    """One user message, rendered and tokenized as the server renders a chat request's."""


class EngineAloneResult(BaseModel):
    streams: int
    tokens: int
    wall_s: float
    cpu_s: float
    """CPU seconds the server's process spent while its callers drained."""

    @property
    def cpu_s_per_1k(self) -> float | None:
        return self.cpu_s * 1000 / self.tokens if self.tokens else None


async def drain(
    engine: SimulatedGpuEngine, prompt: Sequence[int], streams: int, duration_s: float,
    max_tokens: int,
) -> EngineAloneResult:  # fmt: skip
    """`streams` callers run requests back to back on `engine` for duration_s, reading each
    step and nothing more; requests running at the end are aborted (their tokens counted)."""
    tokens = 0
    ids = itertools.count()
    prompt_ids = list(prompt)

    async def caller() -> None:
        nonlocal tokens
        while True:
            async for step in engine.stream(f"engine-alone-{next(ids)}", prompt_ids, max_tokens):
                tokens += step.num_new_tokens

    cpu, start = time.process_time(), time.perf_counter()
    tasks = [asyncio.create_task(caller()) for _ in range(streams)]
    try:
        await asyncio.sleep(duration_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return EngineAloneResult(streams=streams, tokens=tokens, wall_s=wall, cpu_s=cpu)


async def measure_engine_alone(
    direct_base_url: str, streams: int, duration_s: float, max_tokens: int, prompt: str
) -> EngineAloneResult:
    """Ask the direct simulated server (its OpenAI base URL) to drain its engine alone."""
    root = direct_base_url.rstrip("/").removesuffix("/v1")
    body = EngineAloneRequest(
        streams=streams, duration_s=duration_s, max_tokens=max_tokens, prompt=prompt
    )
    async with httpx.AsyncClient(timeout=duration_s + 60) as client:
        response = await client.post(root + PATH, json=body.model_dump())
        response.raise_for_status()
    return EngineAloneResult.model_validate(response.json())


def outside_engine_share(
    worker_cpu_s_per_1k: float | None, alone: EngineAloneResult | None, tokens_per_s: float
) -> float | None:
    """Share of a core a worker spends outside its engine at tokens_per_s: its CPU per 1,000
    tokens less the engine alone's."""
    if worker_cpu_s_per_1k is None or alone is None or alone.cpu_s_per_1k is None:
        return None
    return (worker_cpu_s_per_1k - alone.cpu_s_per_1k) * tokens_per_s / 1000
