"""`llmq replay`: re-drive jobs from a job topic or the dead-letter topic (incident recovery).

The logic sees the broker and Redis only through three protocols (range reader, job producer,
done ledger): unit tests use in-memory fakes; `run_replay_command` alone builds the adapters.

Why each rule:
- A job keeps its ``request_id``: workers, the done ledger and billing are idempotent by it, so
  a replayed job that already ran (or runs twice) is caught downstream as well as here.
- A job goes back to the partition it came from (a pool's workers keep prefix caches per
  partition; a dead letter names its job's topic and partition). Its replay marker names the
  record replay read (for ``--dead``, the letter: it holds the original offsets itself).
- ``finished`` jobs are skipped (the done ledger says a terminal event was sent) unless
  ``--force``; ``expired`` ones always are (a worker drops a job past its deadline) unless
  ``--extend-deadline`` gives them a new one; a request id seen twice in the range (a job
  re-queued after preemption) is sent once. Nothing here logs prompts or completions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from base64 import b64decode
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, get_args

import structlog
import typer
from pydantic import ValidationError

from llmq.replay_input import ReplayUsageError, is_job_topic
from schemas.messages import DeadLetter, InferenceJob, ReplayMarker
from topics import catalog
from topics.ports import JobQueue

log = structlog.get_logger()

SourceRecord = tuple[str, int, int, int, bytes]  # topic, partition, offset, timestamp_ms, value

DEAD_REASONS: tuple[str, ...] = get_args(DeadLetter.model_fields["reason"].annotation)
Skip = Literal["finished", "expired", "duplicate_in_range", "filtered", "unreadable", "misrouted"]


class RangeReader(Protocol):
    """A bounded read of one topic (`topics.kafka_replay.KafkaTopicReader`)."""

    async def partitions(self, topic: str) -> list[int] | None:
        """The topic's partition ids; None if it does not exist."""
        ...

    async def open(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        from_offset: int | None = None,
        to_offset: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Mapping[int, tuple[int, int]]:
        """Fix the range; return ``partition -> (start, end)`` offsets to read."""
        ...

    def records(self, on_read: Callable[[int], None] | None = None) -> AsyncIterator[SourceRecord]:
        """The records in the range, then stop; `on_read` counts records read from the broker."""
        ...


class DoneLedger(Protocol):
    """The done ledger (`topics.ports.JobLedger`): only the question replay asks of it."""

    async def is_finished(self, request_id: str) -> bool: ...


@dataclass(frozen=True)
class JobFilters:
    """Which jobs to replay; every filter set must match (none set: all)."""

    team: str | None = None
    model: str | None = None
    batch_id: str | None = None
    request_ids: frozenset[str] = frozenset()
    reason: str | None = None
    """Dead letters only: the letter's reason."""

    def matches_job(self, job: InferenceJob) -> bool:
        batch_id = job.batch.batch_id if job.batch is not None else None
        return (
            (self.team is None or job.team == self.team)
            and (self.model is None or job.model == self.model)
            and (self.batch_id is None or batch_id == self.batch_id)
            and (not self.request_ids or job.request_id in self.request_ids)
        )

    def matches_letter(self, letter: DeadLetter) -> bool:
        return self.reason is None or letter.reason == self.reason


@dataclass(frozen=True)
class ReplayOptions:
    """One replay run, as the command line describes it."""

    topic: str | None = None
    dead: bool = False
    partitions: tuple[int, ...] = ()
    from_offset: int | None = None
    to_offset: int | None = None
    since: float | None = None
    until: float | None = None
    filters: JobFilters = JobFilters()
    force: bool = False
    extend_deadline_s: float | None = None
    dry_run: bool = False

    @property
    def source_topic(self) -> str:
        return catalog.DEAD_TOPIC if self.dead else (self.topic or "")

    def validate(self) -> None:
        """Raise `ReplayUsageError` for contradictory or impossible options."""
        if self.dead == (self.topic is not None):
            raise ReplayUsageError("give exactly one source: --topic TOPIC or --dead")
        if self.topic is not None and not is_job_topic(self.topic):
            raise ReplayUsageError(
                f"{self.topic!r} is not a job topic (llmq.jobs.<pool>.<interactive|batch>;"
                " the dead-letter topic is read with --dead)"
            )
        offsets = self.from_offset is not None or self.to_offset is not None
        if offsets and (self.since is not None or self.until is not None):
            raise ReplayUsageError("give an offset range or a time range, not both")
        if min((*self.partitions, self.from_offset or 0, self.to_offset or 0)) < 0:
            raise ReplayUsageError("partitions and offsets must be >= 0")
        lo, hi = self.from_offset, self.to_offset
        if lo is not None and hi is not None and lo >= hi:
            raise ReplayUsageError("--from-offset must be below --to-offset (it is exclusive)")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ReplayUsageError("--since must be before --until")
        if self.filters.reason is not None and not self.dead:
            raise ReplayUsageError("--reason applies to --dead only")
        if self.filters.reason not in (None, *DEAD_REASONS):
            raise ReplayUsageError(f"--reason must be one of {', '.join(DEAD_REASONS)}")
        if self.extend_deadline_s is not None and self.extend_deadline_s <= 0:
            raise ReplayUsageError("--extend-deadline must be > 0 seconds")


@dataclass
class ReplaySummary:
    """What one run did; ``scanned`` = ``selected`` + every skip figure."""

    replay_id: str
    dry_run: bool = False
    scanned: int = 0
    selected: int = 0
    sent: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(get_args(Skip), 0))

    def figures(self) -> dict[str, int]:
        """Every figure by name, in print order (``would_send`` in a dry run only)."""
        head = {"scanned": self.scanned, "selected": self.selected, "sent": self.sent}
        if self.dry_run:
            head["would_send"] = self.selected
        return {**head, **self.skipped}

    def lines(self) -> list[str]:
        """One ``name: value`` line per figure, for stdout."""
        return [f"{name}: {value}" for name, value in self.figures().items()]


class Candidate(NamedTuple):
    """A readable job and where it goes back to."""

    job: InferenceJob
    topic: str
    partition: int


def decode(record: SourceRecord, *, dead: bool, filters: JobFilters) -> Candidate | Skip:
    """The job in a record and its destination, or why the record is skipped.

    A job topic's record goes back where it was read; a dead letter's job goes back to the
    topic and partition the letter names (where the job was first read).
    """
    topic, partition, _offset, _ts, value = record
    if dead:
        try:
            letter = DeadLetter.model_validate_json(value)
        except ValidationError:
            return "unreadable"
        if not filters.matches_letter(letter):
            return "filtered"
        try:
            job = InferenceJob.model_validate_json(b64decode(letter.payload_b64, validate=True))
        except (ValidationError, ValueError):  # binascii.Error is a ValueError
            return "unreadable"
        topic, partition = letter.topic, letter.partition
    else:
        try:
            job = InferenceJob.model_validate_json(value)
        except ValidationError:
            return "unreadable"
    if not filters.matches_job(job):
        return "filtered"
    return Candidate(job=job, topic=topic, partition=partition)


class Replayer:
    """One replay run; `summary` holds the figures so far even if the run fails midway."""

    def __init__(
        self,
        options: ReplayOptions,
        reader: RangeReader,
        queue: JobQueue | None,
        ledger: DoneLedger,
        *,
        on_total: Callable[[int], None] | None = None,
        on_read: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.time,
        replay_id: str | None = None,
    ) -> None:
        self._options = options
        self._reader = reader
        self._queue = queue
        self._ledger = ledger
        self._on_total = on_total
        self._on_read = on_read
        self._clock = clock
        self.summary = ReplaySummary(
            replay_id=replay_id or f"replay_{uuid.uuid4().hex[:12]}", dry_run=options.dry_run
        )
        self._seen: set[str] = set()
        self._partitions: dict[str, list[int] | None] = {}

    async def run(self) -> ReplaySummary:
        opts = self._options
        opts.validate()
        source = opts.source_topic
        known = await self._partitions_of(source)
        if known is None:
            raise ReplayUsageError(f"unknown topic {source!r}")
        missing = sorted(set(opts.partitions) - set(known))
        if missing:
            raise ReplayUsageError(f"{source} has partitions {known}; no partition {missing}")
        spans = await self._reader.open(
            source, opts.partitions or None, from_offset=opts.from_offset,
            to_offset=opts.to_offset, since=opts.since, until=opts.until,
        )  # fmt: skip
        if self._on_total is not None:
            self._on_total(sum(end - start for start, end in spans.values()))
        log.info(
            "replay_started", replay_id=self.summary.replay_id, topic=source,
            spans={p: list(s) for p, s in spans.items()}, dry_run=opts.dry_run, force=opts.force,
        )  # fmt: skip
        async for record in self._reader.records(self._on_read):
            self.summary.scanned += 1
            await self._consider(record)
        log.info("replay_finished", replay_id=self.summary.replay_id, **self.summary.figures())
        return self.summary

    async def _partitions_of(self, topic: str) -> list[int] | None:
        if topic not in self._partitions:
            self._partitions[topic] = await self._reader.partitions(topic)
        return self._partitions[topic]

    async def _consider(self, record: SourceRecord) -> None:
        opts = self._options
        topic, partition, offset, _ts, _value = record
        found = decode(record, dead=opts.dead, filters=opts.filters)
        if not isinstance(found, Candidate):
            self._skip(found, record, None)
            return
        job = found.job
        if job.request_id in self._seen:
            self._skip("duplicate_in_range", record, job.request_id)
            return
        self._seen.add(job.request_id)
        if not await self._routable(found):
            self._skip("misrouted", record, job.request_id)
            return
        if not opts.force and await self._ledger.is_finished(job.request_id):
            self._skip("finished", record, job.request_id)
            return
        now = self._clock()
        deadline = job.deadline
        if opts.extend_deadline_s is not None:
            deadline = max(deadline, now + opts.extend_deadline_s)
        if deadline <= now:
            self._skip("expired", record, job.request_id)
            return
        self.summary.selected += 1
        if opts.dry_run:
            return
        assert self._queue is not None, "only a dry run runs without a job queue"
        marker = ReplayMarker(
            replay_id=self.summary.replay_id, source_topic=topic, source_partition=partition,
            source_offset=offset, replayed_at=now, force=opts.force,
        )  # fmt: skip
        replayed = job.model_copy(update={"replay": marker, "deadline": deadline})
        receipt = await self._queue.submit(replayed, partition=found.partition)
        self.summary.sent += 1
        log.debug(
            "replay_job_sent", request_id=job.request_id, source_partition=partition,
            source_offset=offset, partition=receipt.partition, offset=receipt.offset,
        )  # fmt: skip

    async def _routable(self, found: Candidate) -> bool:
        """Whether the destination is a partition of the job's own topic (the producer derives
        the topic from the job's pool and class)."""
        job = found.job
        if catalog.job_topic(job.pool, job.tier) != found.topic:
            return False
        known = await self._partitions_of(found.topic)
        return known is not None and found.partition in known

    def _skip(self, why: Skip, record: SourceRecord, request_id: str | None) -> None:
        self.summary.skipped[why] += 1
        log.debug("replay_skipped", reason=why, request_id=request_id, offset=record[2])


def run_replay_command(options: ReplayOptions, *, bootstrap: str, redis_url: str) -> int:
    """Run one replay against the broker and Redis; print the summary; the exit code
    (0 done, 1 failed midway: the figures so far are printed, 2 bad usage)."""
    return asyncio.run(_run(options, bootstrap, redis_url))


async def _run(options: ReplayOptions, bootstrap: str, redis_url: str) -> int:
    from aiokafka.errors import KafkaError
    from redis.asyncio import Redis
    from redis.exceptions import RedisError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from topics.counted_queue import AnnouncedJobQueue, CountedJobQueue
    from topics.kafka import KafkaJobQueue, KafkaProducer
    from topics.kafka_replay import KafkaTopicReader, ReplayReadError
    from topics.redis_backlog import RedisBacklog
    from topics.redis_relay import RedisJobLedger
    from topics.redis_wake import RedisJobWake

    reader = KafkaTopicReader(bootstrap)
    redis = Redis.from_url(redis_url)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    code = 0
    replayer: Replayer | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(redis.aclose)
            stack.push_async_callback(reader.stop)  # also closes a half-started client
            await reader.start()
            queue: AnnouncedJobQueue | None = None
            if not options.dry_run:  # a dry run produces nothing
                producer = KafkaProducer(bootstrap, client_id="llmq-replay")
                stack.push_async_callback(producer.stop)
                await producer.start()
                counted = CountedJobQueue(KafkaJobQueue(producer), RedisBacklog(redis))
                queue = AnnouncedJobQueue(counted, RedisJobWake(redis))
            with Progress(*columns, console=Console(stderr=True)) as progress:
                task = progress.add_task(f"scan {options.source_topic}", total=None)
                replayer = Replayer(
                    options, reader, queue, RedisJobLedger(redis),
                    on_total=lambda n: progress.update(task, total=n),
                    on_read=lambda n: progress.advance(task, n),
                )  # fmt: skip
                typer.echo(f"replay id: {replayer.summary.replay_id}", err=True)
                await replayer.run()
    except ReplayUsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except (ReplayReadError, KafkaError, RedisError, OSError) as exc:
        typer.echo(f"error: replay stopped: {type(exc).__name__}: {exc}", err=True)
        code = 1
    if replayer is not None:
        for line in replayer.summary.lines():
            typer.echo(line)
    return code
