"""What a job sends back when it ends: its output and finish event to the gateway's reply
channel, or, for a batch line, one result on the durable results topic."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from schemas.chat import FinishReason
from schemas.messages import (
    BatchResultEvent,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
    UsageCounts,
)
from topics.ports import EventPublisher, ResultSink
from workers.engine.port import EngineStep


@dataclass
class Buffered:
    """One choice's output held until the job ends (batch tier: a restart stays unseen)."""

    parts: list[str] = field(default_factory=list)
    tokens: int = 0

    def add(self, step: EngineStep) -> None:
        self.parts.append(step.text)
        self.tokens += step.num_new_tokens


class JobOutput:
    """Publishes the ends of jobs (successful, failed, unreadable)."""

    def __init__(self, publisher: EventPublisher, results: ResultSink) -> None:
        self._publisher = publisher
        self._results = results

    async def finished(
        self,
        job: InferenceJob,
        buffered: dict[int, Buffered] | None,
        finish_reason: FinishReason,
        usage: UsageCounts,
        finish_reasons: tuple[FinishReason, ...] = (),
        started_at: float | None = None,
    ) -> None:
        """The successful end: buffered batch output whole, then the finish event."""
        if job.batch is not None:
            first = (buffered or {}).get(0)
            await self._results.publish(
                BatchResultEvent(
                    request_id=job.request_id,
                    batch=job.batch,
                    model=job.requested_model,
                    model_version=job.model_version,
                    text="".join(first.parts) if first else "",
                    finish_reason=finish_reason,
                    usage=usage,
                    finished_at=time.time(),
                )
            )
            return
        for index, choice in sorted((buffered or {}).items()):
            whole = TokenEvent(
                request_id=job.request_id,
                seq=index,
                text="".join(choice.parts),
                num_tokens=choice.tokens,
                index=index,
            )
            await self._publisher.publish(job.reply_to, whole)
        finish = FinishEvent(
            request_id=job.request_id,
            finish_reason=finish_reason,
            usage=usage,
            finish_reasons=finish_reasons,
            started_at=started_at,
        )
        await self._publisher.publish(job.reply_to, finish)

    async def error(
        self, job: InferenceJob, code: str, message: str, usage: UsageCounts | None = None
    ) -> None:
        """The failed end: an error event (a batch line's goes to the results topic)."""
        usage = usage or UsageCounts()
        if job.batch is not None:
            await self._results.publish(
                BatchResultEvent(
                    request_id=job.request_id,
                    batch=job.batch,
                    model=job.requested_model,
                    model_version=job.model_version,
                    error_code=code,
                    error_message=message,
                    usage=usage,
                    finished_at=time.time(),
                )
            )
            return
        await self._publisher.publish(
            job.reply_to,
            ErrorEvent(request_id=job.request_id, code=code, message=message, usage=usage),
        )

    async def unreadable(self, request_id: str, reply_to: str) -> None:
        """The end of a request whose record could not be read (nothing ran)."""
        await self._publisher.publish(
            reply_to,
            ErrorEvent(
                request_id=request_id,
                code="job_unreadable",
                message="The worker could not read this request (it was set aside for "
                "replay); retry it.",
            ),
        )
