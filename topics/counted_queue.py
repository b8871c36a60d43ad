"""Job queues around a producer's: `CountedJobQueue` counts what it produces into the
admission backlog, as the gateway does; `AnnouncedJobQueue` wakes the pool's idle workers.

Admission predicts TTFT from the prompt tokens queued per pool; the gateway adds a job's
tokens before producing it and the worker takes them off when the job starts. A producer
other than the gateway (`llmq replay`) wraps its queue in `CountedJobQueue`, so its jobs are
counted too instead of briefly hiding from admission (the worker's removal clamps at 0).
"""

from __future__ import annotations

from schemas.messages import InferenceJob
from topics.catalog import PriorityClass
from topics.ports import JobQueue, JobReceipt, JobWake, QueueBacklog


class CountedJobQueue:
    def __init__(self, queue: JobQueue, backlog: QueueBacklog) -> None:
        self._queue = queue
        self._backlog = backlog

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        """Count the job's backlog units, then produce it; a failed produce uncounts them."""
        tokens = job.backlog_units
        tier: PriorityClass = job.tier
        waiting = len(job.prompt_token_ids)
        await self._backlog.add(job.pool, tier, tokens, job.team, waiting)
        try:
            return await self._queue.submit(job, partition=partition)
        except BaseException:
            await self._backlog.remove(job.pool, tier, tokens, job.team, waiting)
            raise

    async def partitions(self, pool: str, tier: PriorityClass) -> int:
        return await self._queue.partitions(pool, tier)


class AnnouncedJobQueue:
    """A job queue that wakes the pool's quiet workers (`JobWake`) as it queues each job: what
    the gateway, the batch service and a worker re-queuing a job produce through. The
    announcement goes out once the broker has acknowledged the job, so a fetch sent by a
    woken worker finds it at once, and a worker that found its partitions empty after the
    last announcement may stop polling (`workers.caught_up`)."""

    def __init__(self, queue: JobQueue, wake: JobWake) -> None:
        self._queue = queue
        self._wake = wake

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        receipt = await self._queue.submit(job, partition=partition)
        await self._wake.announce(job.pool)
        return receipt

    async def partitions(self, pool: str, tier: PriorityClass) -> int:
        return await self._queue.partitions(pool, tier)
