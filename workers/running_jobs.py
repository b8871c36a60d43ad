"""The jobs a worker runs: one task per job, and how each run settles its record's offset.

The pull loop (`workers.pull_loop`) decides what to fetch and what to start; this module runs
what it starts and records how each run ended:
- a run that reached its terminal event finishes its offset (`OffsetTracker.finished`);
- a run the engine failed before its caller saw a token, or that Redis or Kafka broke, is
  re-queued to its topic, and its offset finishes once the copy is queued (a failed re-queue
  keeps the offset: a restart re-delivers the job);
- a run cancelled by its client ends there; a preempted one is re-queued; one cancelled by a
  drain past its grace or a crash never finished, so its offset stays uncommitted.

A second record of a job that still runs here (its own re-queue, fetched while the failed run
is still recording it) is held and queued again when that run ends: dropping it lost the job,
since its offset was committed and nothing ran it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aiokafka import TopicPartition

from schemas.messages import InferenceJob
from topics.ports import JobQueue
from workers.engine.port import EngineClient
from workers.headroom import EngineLoad
from workers.offsets import OffsetTracker
from workers.runner import JobOrigin, JobRunner, RunFailed

log = structlog.get_logger()


@dataclass(frozen=True)
class Fetched:
    """A job record fetched from its partition, with the KV tokens it may reserve."""

    tp: TopicPartition
    offset: int
    job: InferenceJob
    tokens: int
    fetched_at: float = field(default_factory=time.time)


class RunningJobs:
    def __init__(
        self,
        engine: EngineClient,
        runner: JobRunner,
        *,
        requeue: JobQueue,
        offsets: OffsetTracker[TopicPartition],
        queue_again: Callable[[Fetched], None],
        changed: Callable[[], None],
    ) -> None:
        """`queue_again` takes back a held copy when its job's run ends; `changed` is called
        whenever a slot frees (a run ended, or the engine is done with a job)."""
        self._engine = engine
        self._runner = runner
        self._requeue = requeue
        self._offsets = offsets
        self._queue_again = queue_again
        self._changed = changed
        self._running: dict[str, tuple[asyncio.Task[None], Fetched]] = {}
        self._held: dict[str, list[Fetched]] = {}
        self._engine_done: set[str] = set()
        """Running jobs the engine is done with (their slot is free) while their outcome is
        being recorded."""
        self._cancelled_by_client: set[str] = set()
        self._preempted: set[str] = set()

    def __len__(self) -> int:
        return len(self._running)

    def in_engine(self) -> list[InferenceJob]:
        """The running jobs still holding an engine slot."""
        return [f.job for rid, (_, f) in self._running.items() if rid not in self._engine_done]

    def held_copies(self) -> list[Fetched]:
        return [copy for copies in self._held.values() for copy in copies]

    def tasks(self) -> list[asyncio.Task[None]]:
        return [task for task, _ in self._running.values()]

    def start(self, item: Fetched) -> bool:
        """Run a job; False when it already runs here (a second record of it is held)."""
        rid = item.job.request_id
        running = self._running.get(rid)
        if running is not None:
            if (running[1].tp, running[1].offset) != (item.tp, item.offset):
                self._held.setdefault(rid, []).append(item)
                log.info("job_copy_held", request_id=rid, offset=item.offset)
            return False  # the very record again: the run in flight settles its offset
        task = asyncio.create_task(self._run(item), name=rid)
        self._running[rid] = (task, item)
        return True

    def forget(self, partitions: set[TopicPartition]) -> int:
        """Partitions revoked: drop the held copies from them; how many were dropped."""
        dropped = 0
        for rid, copies in list(self._held.items()):
            kept = [copy for copy in copies if copy.tp not in partitions]
            dropped += len(copies) - len(kept)
            if kept:
                self._held[rid] = kept
            else:
                del self._held[rid]
        return dropped

    async def cancel(self, request_id: str) -> bool:
        """Abort a running job at its client's request; False if it is not running here."""
        entry = self._running.get(request_id)
        if entry is None:
            return False
        if request_id in self._cancelled_by_client:
            return True  # a repeated cancel must not interrupt the job recording its end
        if not self._runner.cancelled_by_client(request_id):
            return False
        self._cancelled_by_client.add(request_id)
        entry[0].cancel()
        await self._engine.abort(request_id)
        log.info("job_cancelled", request_id=request_id)
        return True

    async def preempt(self, request_id: str, load: EngineLoad) -> bool:
        """Stop a running job to free its slot; it is re-queued, so its caller never sees the
        restart. False if it is not running here."""
        entry = self._running.get(request_id)
        if entry is None:
            return False
        task, _ = entry
        self._preempted.add(request_id)
        task.cancel()
        await self._engine.abort(request_id)
        await asyncio.wait([task])
        log.info(
            "job_preempted",
            request_id=request_id,
            in_flight=load.in_flight,
            max_num_seqs=load.max_num_seqs,
            kv_cache_usage=round(load.kv_cache_usage, 3),
            kv_capacity_tokens=load.kv_capacity_tokens,
            reserved_tokens=load.reserved_tokens,
        )
        return True

    async def abandon(self) -> None:
        """Stop every running job without finishing its offset (crash semantics)."""
        tasks = self.tasks()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _run(self, item: Fetched) -> None:
        job = item.job
        structlog.contextvars.bind_contextvars(partition=item.tp.partition, offset=item.offset)
        terminal = False
        try:
            origin = JobOrigin(item.tp.topic, item.tp.partition, item.offset, item.fetched_at)
            await self._runner.run(job, origin, lambda: self._slot_freed(job.request_id))
            terminal = True
        except RunFailed:  # the engine raised before the caller saw a token: run it again
            terminal = await self._requeue_job(job)
        except Exception as exc:  # Redis or Kafka failed us: re-queue, never stall the offset
            log.error("job_run_broken", request_id=job.request_id, error=type(exc).__name__)
            terminal = await self._requeue_job(job)
        except asyncio.CancelledError:
            if job.request_id in self._preempted:
                terminal = await self._requeue_job(job)
            else:
                terminal = job.request_id in self._cancelled_by_client
            if not terminal:
                raise
        finally:
            self._cancelled_by_client.discard(job.request_id)
            self._preempted.discard(job.request_id)
            self._running.pop(job.request_id, None)
            self._engine_done.discard(job.request_id)
            if terminal:
                self._offsets.finished(item.tp, item.offset)
            for copy in self._held.pop(job.request_id, ()):
                self._queue_again(copy)  # a copy of a job that finished is skipped by the runner
            self._changed()

    def _slot_freed(self, request_id: str) -> None:
        """The engine is done with a job: its slot may take the next one now."""
        self._engine_done.add(request_id)
        self._changed()

    async def _requeue_job(self, job: InferenceJob) -> bool:
        try:
            receipt = await self._requeue.submit(job)
        except Exception as exc:  # keep the offset: a restart re-delivers the job
            log.warning("job_requeue_failed", request_id=job.request_id, error=type(exc).__name__)
            return False
        log.info("job_requeued", request_id=job.request_id, offset=receipt.offset)
        return True
