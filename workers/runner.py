"""Runs one job through the engine and publishes what happens to it.

Every job ends in exactly one terminal event (finish or error) on its `reply_to` channel and,
when the engine ran it, one usage record that bills only the tokens that were produced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from schemas.messages import (
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
    UsageCounts,
    UsageRecord,
)
from topics.ports import CancelBus, EventPublisher, UsageSink
from workers.engine.port import EngineClient

log = structlog.get_logger()


@dataclass
class JobOutcome:
    outcome: str
    usage: UsageCounts


class JobRunner:
    def __init__(
        self,
        engine: EngineClient,
        publisher: EventPublisher,
        usage: UsageSink,
        cancels: CancelBus,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self._usage = usage
        self._cancels = cancels

    async def run(self, job: InferenceJob) -> JobOutcome:
        """Run `job` to a terminal event. Cancellation of the calling task aborts the engine."""
        bound = log.bind(request_id=job.request_id, team=job.team, model=job.model)
        if await self._cancels.is_cancelled(job.request_id):
            bound.info("job_skipped_cancelled")
            return JobOutcome("cancelled", UsageCounts())
        if time.time() > job.deadline:
            await self._publisher.publish(
                job.reply_to,
                ErrorEvent(
                    request_id=job.request_id,
                    code="deadline_exceeded",
                    message="The request expired in the queue before a worker could start it.",
                ),
            )
            bound.info("job_expired", late_s=round(time.time() - job.deadline, 3))
            return JobOutcome("deadline_exceeded", UsageCounts())

        started = time.time()
        usage = UsageCounts(prompt_tokens=len(job.prompt_token_ids))
        outcome = "cancelled"
        seq = 0
        try:
            async for step in self._engine.generate(job):
                usage = UsageCounts(
                    prompt_tokens=step.prompt_tokens,
                    cached_tokens=step.cached_tokens,
                    completion_tokens=usage.completion_tokens + step.num_new_tokens,
                )
                if step.text or step.num_new_tokens:
                    await self._publisher.publish(
                        job.reply_to,
                        TokenEvent(
                            request_id=job.request_id,
                            seq=seq,
                            text=step.text,
                            num_tokens=step.num_new_tokens,
                        ),
                    )
                    seq += 1
                if step.finished:
                    outcome = step.finish_reason or "stop"
            if outcome not in ("stop", "length"):
                outcome = "stop"
            await self._publisher.publish(
                job.reply_to,
                FinishEvent(request_id=job.request_id, finish_reason=outcome, usage=usage),
            )
        except Exception as exc:
            outcome = "engine_error"
            bound.error("job_failed", error=type(exc).__name__)
            await self._publisher.publish(
                job.reply_to,
                ErrorEvent(
                    request_id=job.request_id,
                    code="engine_error",
                    message="The engine failed while running this request.",
                    usage=usage,
                ),
            )
        finally:
            await self._usage.record(
                UsageRecord(
                    request_id=job.request_id,
                    team=job.team,
                    model=job.model,
                    tier=job.tier,
                    prompt_tokens=usage.prompt_tokens,
                    cached_tokens=usage.cached_tokens,
                    completion_tokens=usage.completion_tokens,
                    finish_reason=outcome,
                    finished_at=time.time(),
                )
            )
            bound.info(
                "job_finished",
                outcome=outcome,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                seconds=round(time.time() - started, 4),
            )
        return JobOutcome(outcome, usage)
