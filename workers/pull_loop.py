"""The worker's pull loop: fetch only what the engine can start, commit only what is done.

- Headroom first: the loop asks the broker for at most as many jobs as the engine has free
  sequence slots, and pauses every partition while it has none (nothing is prefetched that
  cannot start). Interactive records are started before batch records of the same fetch.
- Commit discipline: see `workers.offsets`.
- Drain: `stop()` stops fetching; in-flight jobs finish (up to a grace period), offsets are
  committed and the consumer leaves its group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from pydantic import ValidationError

from schemas.messages import InferenceJob
from topics import catalog
from workers.engine.port import EngineClient
from workers.offsets import OffsetTracker
from workers.runner import JobRunner

log = structlog.get_logger()


class RedisCancelListener(Protocol):
    def listen(self) -> AsyncIterator[str]: ...


class _CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, loop: PullLoop) -> None:
        self._loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._loop.commit()
        for tp in revoked:
            self._loop.offsets.forget(tp)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info(
            "partitions_assigned", partitions=[f"{tp.topic}:{tp.partition}" for tp in assigned]
        )


class PullLoop:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        engine: EngineClient,
        runner: JobRunner,
        pool: str,
        *,
        max_in_flight: int,
    ) -> None:
        self._consumer = consumer
        self._engine = engine
        self._runner = runner
        self._pool = pool
        self._max_in_flight = max_in_flight
        self.offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._cancelled_by_client: set[str] = set()
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._interactive_topic = catalog.job_topic(pool, "interactive")

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def assigned(self) -> list[str]:
        return sorted(f"{tp.topic}:{tp.partition}" for tp in self._consumer.assignment())

    def stop(self) -> None:
        self._stopping.set()
        self._slot_freed.set()

    async def cancel(self, request_id: str) -> bool:
        """Abort a running job (its KV blocks are freed); False if it is not running here."""
        task = self._running.get(request_id)
        if task is None:
            return False
        self._cancelled_by_client.add(request_id)
        self._runner.cancelled_by_client(request_id)
        task.cancel()
        await self._engine.abort(request_id)
        log.info("job_cancelled", request_id=request_id)
        return True

    async def run(self, drain_grace_s: float) -> None:
        topics = [catalog.job_topic(self._pool, cls) for cls in catalog.PRIORITY_CLASSES]
        self._consumer.subscribe(topics, listener=_CommitOnRevoke(self))
        while not self._stopping.is_set():
            free = self._max_in_flight - self.in_flight
            if free <= 0:
                self._pause_all()
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._resume_all()
            batches = await self._consumer.getmany(timeout_ms=100, max_records=free)
            records = [(tp, rec) for tp, recs in batches.items() for rec in recs]
            records.sort(key=lambda item: item[0].topic != self._interactive_topic)
            for tp, record in records:
                self._start(tp, record.offset, record.value)
            await self.commit()
        await self._drain(drain_grace_s)

    def _pause_all(self) -> None:
        assignment = self._consumer.assignment()
        if assignment:
            self._consumer.pause(*assignment)

    def _resume_all(self) -> None:
        paused = self._consumer.paused()
        if paused:
            self._consumer.resume(*paused)

    def _start(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        self.offsets.started(tp, offset)
        try:
            job = InferenceJob.model_validate_json(value or b"")
        except ValidationError as exc:
            log.warning(
                "job_rejected", partition=tp.partition, offset=offset, errors=exc.error_count()
            )
            self.offsets.finished(tp, offset)
            return
        if job.request_id in self._running:  # the same job twice in one fetch: run it once
            self.offsets.finished(tp, offset)
            return
        task = asyncio.create_task(self._run_job(tp, offset, job), name=job.request_id)
        self._running[job.request_id] = task

    async def _run_job(self, tp: TopicPartition, offset: int, job: InferenceJob) -> None:
        structlog.contextvars.bind_contextvars(partition=tp.partition, offset=offset)
        terminal = False
        try:
            await self._runner.run(job)
            terminal = True
        except asyncio.CancelledError:
            # Cancelled by its client: that is its end. Cancelled by a drain past its grace
            # or a shutdown: it never finished, so its offset stays uncommitted and the job
            # is re-delivered to whichever worker owns the partition next.
            terminal = job.request_id in self._cancelled_by_client
            if not terminal:
                raise
        finally:
            self._cancelled_by_client.discard(job.request_id)
            self._running.pop(job.request_id, None)
            if terminal:
                self.offsets.finished(tp, offset)
            self._slot_freed.set()

    async def commit(self) -> None:
        offsets = self.offsets.to_commit()
        if not offsets:
            return
        assignment = self._consumer.assignment()
        owned = {tp: off for tp, off in offsets.items() if tp in assignment}
        if not owned:
            return
        try:
            await self._consumer.commit(owned)
        except Exception as exc:  # a rebalance in progress: the next loop commits again
            log.warning("commit_failed", error=type(exc).__name__)
            return
        self.offsets.committed(owned)

    async def abandon(self) -> None:
        """Stop every running job without committing it (crash semantics: re-delivered)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _drain(self, grace_s: float) -> None:
        self._pause_all()
        tasks = list(self._running.values())
        log.info("drain_started", in_flight=len(tasks))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            if pending:
                log.warning("drain_grace_exceeded", aborted=len(pending))
                await self.abandon()
        await self.commit()
        log.info("drain_finished")


async def listen_for_cancels(cancels: RedisCancelListener, loop: PullLoop) -> None:
    """Abort running jobs as their gateways cancel them."""
    async for request_id in cancels.listen():
        with contextlib.suppress(Exception):
            await loop.cancel(request_id)
