"""A scripted engine for integration tests of the queue path (the broker and Redis are real).

It stands in for vLLM only where the test is about Kafka offsets and the Redis relay; the
real engine is proven by the e2e tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

from schemas.messages import InferenceJob
from workers.engine.port import EngineStats, EngineStep


class ScriptedEngine:
    """Answers each job with "<request_id>:<i>" tokens; jobs named in `hold` never finish,
    jobs in `stall_after` stop (forever) after that many tokens, jobs in `fail` raise."""

    def __init__(
        self,
        tokens: int = 3,
        hold: set[str] | None = None,
        max_num_seqs: int = 4,
        step_s: float = 0.0,
        stall_after: dict[str, int] | None = None,
        fail: set[str] | None = None,
        tokens_by_prefix: dict[str, int] | None = None,
    ) -> None:
        self.tokens = tokens
        self.tokens_by_prefix = tokens_by_prefix or {}
        """Tokens for jobs whose request id starts with a prefix (others: ``tokens``)."""
        self.started_at: dict[str, float] = {}
        """Monotonic time each job last started generating."""
        self.stall_after = stall_after or {}
        self.hung = False
        """Set it to make every generation hang (an engine that stopped stepping)."""
        self.fail = fail or set()
        self.step_s = step_s
        self.order: list[str] = []
        self.log: list[tuple[str, str]] = []
        """("start" | "end", request_id) in the order generations started and ended."""
        self.hold = hold or set()
        self.max_num_seqs = max_num_seqs
        self.max_model_len = 4096
        self.kv_capacity_tokens = 0
        self.calls: Counter[str] = Counter()
        self.running: set[str] = set()
        self.peak_running = 0
        """The most jobs that were generating at once."""
        self.started = asyncio.Event()
        self.generating = asyncio.Event()
        """Set once the first job starts generating."""
        self.stalled = asyncio.Event()
        """Set once a job named in `stall_after` has stalled."""

    async def start(self) -> None:
        self.started.set()

    async def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        self.calls[job.request_id] += 1
        self.order.append(job.request_id)
        self.log.append(("start", job.request_id))
        self.started_at[job.request_id] = time.monotonic()
        self.running.add(job.request_id)
        self.peak_running = max(self.peak_running, len(self.running))
        self.generating.set()
        try:
            if job.request_id in self.hold or self.hung:
                await asyncio.Event().wait()
            if job.request_id in self.fail:
                raise RuntimeError("scripted engine failure")
            prompt = len(job.prompt_token_ids)
            tokens = next(
                (
                    n
                    for prefix, n in self.tokens_by_prefix.items()
                    if job.request_id.startswith(prefix)
                ),
                self.tokens,
            )
            for i in range(tokens):
                if self.stall_after.get(job.request_id) == i:
                    self.stalled.set()
                    await asyncio.Event().wait()
                await asyncio.sleep(self.step_s)
                yield EngineStep(
                    text=f"{job.request_id}:{i} ",
                    num_new_tokens=1,
                    prompt_tokens=prompt,
                    cached_tokens=0,
                    finished=i == tokens - 1,
                    finish_reason="length" if i == tokens - 1 else None,
                )
        finally:
            self.running.discard(job.request_id)
            self.log.append(("end", job.request_id))

    async def abort(self, request_id: str) -> None:
        self.running.discard(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.running))

    async def shutdown(self) -> None:
        return None
