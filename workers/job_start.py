"""A job leaving the queue, through the separate ports (`GatheredJobStart`): what a worker
uses when its stores give no one-round-trip `JobStart` (unit tests' in-memory fakes)."""

from __future__ import annotations

import asyncio

from schemas.messages import InferenceJob
from topics.ports import CancelBus, JobAttempts, JobLedger, QueueBacklog, StartChecks


class GatheredJobStart:
    """The checks as concurrent calls of the separate ports."""

    def __init__(
        self, backlog: QueueBacklog, ledger: JobLedger, attempts: JobAttempts, cancels: CancelBus
    ) -> None:
        self._backlog = backlog
        self._ledger = ledger
        self._attempts = attempts
        self._cancels = cancels

    async def begin(self, job: InferenceJob, attempt_key: str) -> StartChecks:
        _, finished, earlier, cancelled = await asyncio.gather(
            self._backlog.remove(job.pool, job.tier, len(job.prompt_token_ids), job.team),
            self._ledger.is_finished(job.request_id),
            self._attempts.begin(attempt_key),
            self._cancels.is_cancelled(job.request_id),
        )
        return StartChecks(finished=finished, cancelled=cancelled, earlier=earlier)
