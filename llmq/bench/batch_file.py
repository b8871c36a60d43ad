"""``llmq bench batch``: a batch file through the Batch API beside an interactive stream.

Two runs on the same running stack, side by side:

* baseline: team A's interactive stream alone for ``duration_s``;
* variant: a batch file of ``lines`` requests is uploaded and created at t=0 (Files and Batch API,
  OpenAI SDK), and the same interactive stream runs until the batch reaches a final status
  (bounded by ``max_wait_s``).

It prints interactive TTFT p95 with and without the batch and the batch's lines per second
(from its ``created_at`` to its ``completed_at``, as the API reports them).
"""

from __future__ import annotations

import asyncio
import json
import time

import openai
from pydantic import BaseModel, Field

from llmq.bench.load import run_load_async
from llmq.bench.load_model import LoadReport, LoadSettings

FINAL = ("completed", "failed", "expired", "cancelled")


class BatchFileSettings(BaseModel):
    load: LoadSettings = Field(default_factory=LoadSettings)
    """The interactive stream (its ``duration_s`` is the baseline's length)."""
    lines: int = Field(default=1000, ge=1, le=50_000)
    max_tokens: int = Field(default=8, ge=1)
    """Output tokens per batch line."""
    max_wait_s: float = Field(default=1800.0, gt=0)
    poll_interval_s: float = Field(default=1.0, gt=0)


class BatchOutcome(BaseModel):
    batch_id: str
    status: str
    total: int
    completed: int
    failed: int
    seconds: float | None
    """From the batch's creation to its end, as the API stamps them."""

    @property
    def lines_per_s(self) -> float | None:
        if not self.seconds:
            return None
        return (self.completed + self.failed) / self.seconds


class BatchFileComparison(BaseModel):
    baseline: LoadReport
    variant: LoadReport
    batch: BatchOutcome


def batch_lines(settings: BatchFileSettings) -> bytes:
    """Short chat requests, each with its own question (no shared prefix to cache)."""
    model = settings.load.model
    lines = (
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Write one sentence about {i}."}],
                "max_tokens": settings.max_tokens,
            },
        }
        for i in range(settings.lines)
    )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def _follow(client: openai.AsyncOpenAI, batch_id: str, s: BatchFileSettings) -> BatchOutcome:
    deadline = time.monotonic() + s.max_wait_s
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in FINAL or time.monotonic() > deadline:
            break
        await asyncio.sleep(s.poll_interval_s)
    counts = batch.request_counts
    end = batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at
    return BatchOutcome(
        batch_id=batch.id,
        status=batch.status,
        total=counts.total if counts else 0,
        completed=counts.completed if counts else 0,
        failed=counts.failed if counts else 0,
        seconds=float(end - batch.created_at) if end else None,
    )


async def run_batch_file_async(settings: BatchFileSettings) -> BatchFileComparison:
    load = settings.load
    baseline = await run_load_async(load.model_copy(update={"batch_flood": 0}))
    key = load.api_keys[load.team_a]
    client = openai.AsyncOpenAI(base_url=load.base_url, api_key=key, max_retries=2)
    try:
        uploaded = await client.files.create(
            file=("bench.jsonl", batch_lines(settings), "application/jsonl"), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        stop = asyncio.Event()
        endless = load.model_copy(update={"batch_flood": 0, "duration_s": settings.max_wait_s})
        interactive = asyncio.create_task(run_load_async(endless, stop=stop))
        try:
            outcome = await _follow(client, batch.id, settings)
        finally:
            stop.set()
        variant = await interactive
    finally:
        await client.close()
    return BatchFileComparison(baseline=baseline, variant=variant, batch=outcome)


def run_batch_file(settings: BatchFileSettings) -> BatchFileComparison:
    return asyncio.run(run_batch_file_async(settings))


def format_batch_file(c: BatchFileComparison) -> str:
    team = c.baseline.settings.team_a
    before = c.baseline.group("interactive", team)
    after = c.variant.group("interactive", team)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    b95 = before.ttft_p95_s if before else None
    a95 = after.ttft_p95_s if after else None
    ratio = f"{a95 / b95:.2f}" if a95 is not None and b95 else "-"
    rate = c.batch.lines_per_s
    lines = [
        f"batch {c.batch.batch_id}: {c.batch.status}, {c.batch.completed} completed, "
        f"{c.batch.failed} failed of {c.batch.total} in "
        f"{'-' if c.batch.seconds is None else f'{c.batch.seconds:.0f} s'}"
        f" ({'-' if rate is None else f'{rate:.2f}'} lines/s)",
        f"interactive ({team}) requests: {before.requests if before else 0} without, "
        f"{after.requests if after else 0} with the batch",
        f"interactive TTFT p50: {ms(before.ttft_p50_s if before else None)} without, "
        f"{ms(after.ttft_p50_s if after else None)} with",
        f"interactive TTFT p95: {ms(b95)} without, {ms(a95)} with (ratio {ratio})",
        f"interactive 429s: {before.rate_limited if before else 0} without, "
        f"{after.rate_limited if after else 0} with",
    ]
    return "\n".join(lines)
