"""A job's own re-queue, fetched while the failed run is still recording it, is run again.

When the engine fails a job before its first token (`RunFailed`), `PullLoop._run_job`
re-queues it (`requeue.submit`: a new record of the same job, here at offset 2) while the job
is still in `_running`. If the fetch brings that new record back before the failed run has
left `_running`, `_start` used to take it for a duplicate, mark its offset finished and drop
it: the job was lost (its offset committed, nothing ran it). Now `_start` holds such a copy
(another record than the one running) until the run ends, then queues it again; the very
record seen again is ignored, its offset left to the run in flight.

The fakes below drive a real `PullLoop` deterministically: the consumer's fetch returns only
what a test (or the re-queue) puts in its queue, and the re-queue blocks until released.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

from aiokafka import TopicPartition

from schemas.messages import DeadLetter, InferenceJob, SamplingSettings, UsageCounts
from topics import catalog
from topics.ports import JobReceipt
from workers.engine.port import EngineClient, EngineStats
from workers.load import LoadTracker
from workers.pull_loop import PullLoop
from workers.runner import JobOrigin, JobOutcome, JobRunner, RunFailed

POOL = "p"
TP = TopicPartition(catalog.job_topic(POOL, "interactive"), 0)
COPY_OFFSET = 2  # where the re-queued copy lands

Batch = dict[TopicPartition, list[SimpleNamespace]]


def _job(request_id: str) -> InferenceJob:
    return InferenceJob(
        request_id=request_id, team="t", model="m", pool=POOL, prompt_token_ids=(1,),
        sampling=SamplingSettings(max_tokens=8), created_at=0, deadline=1e12, reply_to="r",
    )  # fmt: skip


def _batch(offset: int, job: InferenceJob) -> Batch:
    return {TP: [SimpleNamespace(offset=offset, value=job.model_dump_json().encode())]}


class FakeConsumer:
    """One assigned partition; a fetch returns the next batch put in `batches`."""

    def __init__(self) -> None:
        self.batches: asyncio.Queue[Batch] = asyncio.Queue()
        self.commits: list[dict[TopicPartition, int]] = []
        self.fetches = 0
        self._fetch_called = asyncio.Event()
        self._paused: set[TopicPartition] = set()

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener  # `CommitOnRevoke(loop)`: the tests call `forget` directly

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused.difference_update(tps)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    async def getmany(self, timeout_ms: float, max_records: int) -> Batch:
        self.fetches += 1
        self._fetch_called.set()
        return await self.batches.get()

    async def fetched(self, count: int) -> None:
        """Until the loop has called fetch `count` times: it handled every batch before."""
        while self.fetches < count:
            self._fetch_called.clear()
            await self._fetch_called.wait()


class FakeRunner:
    """The first run of a job in `fail_first` fails before any token (the engine is done
    with it first); every other run waits for `hold` before it ends."""

    def __init__(self, fail_first: frozenset[str]) -> None:
        self.calls: Counter[str] = Counter()
        self.origins: list[JobOrigin] = []
        self.hold = asyncio.Event()
        self.started = asyncio.Event()
        self.returning = asyncio.Event()
        self._fail_first = fail_first

    async def run(
        self, job: InferenceJob, origin: JobOrigin, on_engine_done: Callable[[], None]
    ) -> JobOutcome:
        self.calls[job.request_id] += 1
        self.origins.append(origin)
        if job.request_id in self._fail_first and self.calls[job.request_id] == 1:
            on_engine_done()
            raise RunFailed
        self.started.set()
        await self.hold.wait()
        on_engine_done()
        self.returning.set()  # `_run_job`'s finally runs in this same step, before anyone
        return JobOutcome("finished", UsageCounts())


class GatedQueue:
    """The re-queue: produces the copy (the fetch can return it at once), then blocks until
    `release`, as a produce waiting for its acks does."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self._consumer = consumer
        self.submitted = asyncio.Event()
        self.release = asyncio.Event()
        self.returned = asyncio.Event()

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self._consumer.batches.put_nowait(_batch(COPY_OFFSET, job))
        self.submitted.set()
        await self.release.wait()
        self.returned.set()  # the failed run's finally runs in this same step
        return JobReceipt(TP.topic, TP.partition, COPY_OFFSET)

    async def partitions(self, pool: str, tier: str) -> int:
        return 1


class FakeEngine:
    """What the loop reads of its engine (the fake runner never calls it): its load."""

    max_num_seqs = 4
    kv_capacity_tokens = 0  # unknown: slots alone decide what starts

    def stats(self) -> EngineStats:
        return EngineStats()


class NoDeadLetters:
    async def publish(self, letter: DeadLetter) -> None:
        raise AssertionError("no record here is malformed")


@dataclass
class Rig:
    consumer: FakeConsumer
    runner: FakeRunner
    queue: GatedQueue
    loop: PullLoop


@contextlib.asynccontextmanager
async def _rig(fail_first: frozenset[str] = frozenset()) -> AsyncIterator[Rig]:
    consumer = FakeConsumer()
    runner = FakeRunner(fail_first)
    queue = GatedQueue(consumer)
    loop = PullLoop(
        consumer, cast(EngineClient, FakeEngine()), cast(JobRunner, runner), POOL,
        requeue=queue, dead_letters=NoDeadLetters(), load=LoadTracker(),
    )  # fmt: skip
    task = asyncio.create_task(loop.run(drain_grace_s=1))
    try:
        yield Rig(consumer, runner, queue, loop)
    finally:
        loop.stop()
        runner.hold.set()
        queue.release.set()
        consumer.batches.put_nowait({})  # the fetch in flight is never cancelled: end it
        await asyncio.wait_for(task, timeout=2)


async def test_a_requeued_copy_fetched_while_its_failed_run_records_it_runs_again() -> None:
    async with asyncio.timeout(5), _rig(fail_first=frozenset({"poison"})) as rig:
        rig.consumer.batches.put_nowait(_batch(0, _job("poison")))
        await rig.queue.submitted.wait()  # run 1 failed and is inside requeue.submit
        await rig.consumer.fetched(3)  # the loop has taken the copy and come back for more
        assert rig.runner.calls["poison"] == 1
        assert (rig.loop.in_flight, rig.loop.buffered) == (1, 1)  # the copy is held
        assert (rig.loop.offsets.in_flight(TP), rig.loop.offsets.to_commit()) == (2, {})
        assert rig.consumer.commits == [{TP: 0}]

        rig.queue.release.set()  # run 1 ends: re-queued, so its offset 0 is done
        await rig.runner.started.wait()
        assert (rig.runner.calls["poison"], rig.runner.origins[-1].offset) == (2, COPY_OFFSET)
        assert rig.loop.buffered == 0
        assert rig.loop.offsets.to_commit() == {TP: COPY_OFFSET}  # not past the copy

        rig.runner.hold.set()
        await rig.runner.returning.wait()
        assert rig.loop.offsets.to_commit() == {TP: COPY_OFFSET + 1}
    assert rig.runner.calls["poison"] == 2
    assert rig.consumer.commits == [{TP: 0}, {TP: COPY_OFFSET + 1}]


async def test_the_same_record_fetched_again_while_it_runs_stays_unfinished() -> None:
    async with asyncio.timeout(5), _rig() as rig:
        job = _job("slow")
        rig.consumer.batches.put_nowait(_batch(0, job))
        await rig.runner.started.wait()
        rig.consumer.batches.put_nowait(_batch(0, job))  # redelivered while it runs
        await rig.consumer.fetched(3)
        assert rig.runner.calls["slow"] == 1
        assert (rig.loop.in_flight, rig.loop.buffered) == (1, 0)  # neither held nor run
        assert (rig.loop.offsets.in_flight(TP), rig.loop.offsets.to_commit()) == (1, {})

        rig.runner.hold.set()
        await rig.runner.returning.wait()
        assert rig.loop.offsets.to_commit() == {TP: 1}
    assert rig.runner.calls["slow"] == 1
    assert rig.consumer.commits == [{TP: 0}, {TP: 1}]


async def test_forget_drops_the_held_copy_of_a_revoked_partition() -> None:
    async with asyncio.timeout(5), _rig(fail_first=frozenset({"poison"})) as rig:
        rig.consumer.batches.put_nowait(_batch(0, _job("poison")))
        await rig.consumer.fetched(3)
        assert rig.loop.buffered == 1  # the copy is held

        rig.loop.forget({TP})
        assert (rig.loop.buffered, rig.loop.offsets.in_flight(TP)) == (0, 0)

        rig.queue.release.set()
        await rig.queue.returned.wait()  # run 1's finally has run: nothing to queue again
        rig.consumer.batches.put_nowait({})
        await rig.consumer.fetched(4)  # a whole turn since, a start included
        assert (rig.loop.in_flight, rig.loop.buffered) == (0, 0)
    assert rig.runner.calls["poison"] == 1
