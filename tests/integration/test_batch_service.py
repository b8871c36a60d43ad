"""The batch service's parts on real Redis, Kafka and S3 (moto): state, fan-out, collection.

The engine is not involved here: results are produced to the results topic as a worker would.
The whole flow with the real engine and the OpenAI SDK is in tests/e2e/test_batches.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aioboto3
import pytest
from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis

from batch.collector import ResultCollector
from batch.fanout import BatchFanout
from batch.finalize import BatchFinalizer
from batch.ports import iter_lines
from batch.quota import LineQuota
from batch.redis_store import RedisBatchStore
from batch.results import line_id
from batch.s3_files import S3FileStore
from control.served import ServedModels
from schemas.batches import Batch
from schemas.deployment import Deployment
from schemas.messages import BatchLineRef, BatchResultEvent, InferenceJob, UsageCounts
from schemas.render import ChatRenderer
from schemas.teams import TeamPolicy
from tests.polling import eventually
from topics import catalog
from topics.kafka import KafkaJobQueue, KafkaProducer, KafkaResultSink
from topics.kafka_streams import kafka_broker, subscribe
from topics.redis_backlog import RedisBacklog
from topics.redis_token_bucket import RedisTokenBucket
from topics.streams import BATCH_RESULTS

pytestmark = pytest.mark.integration


class CharTokenizer:
    """One token per byte of the rendered conversation: enough to route and count."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return "\n".join(f"{m['role']}: {m['content']}" for m in conversation)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return list(text.encode())


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A Redis database of its own: the session's e2e batch service (database 0) also reads the
    results topic, and must not find these tests' batches."""
    client = Redis.from_url(redis_url.rsplit("/", 1)[0] + "/7")
    yield client
    await client.aclose()


@pytest.fixture
async def files(s3_endpoint: str) -> AsyncIterator[S3FileStore]:
    session = aioboto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    store = S3FileStore(session, f"b{uuid.uuid4().hex[:12]}", s3_endpoint)
    await store.start()
    yield store
    await store.stop()


def batch_file(n: int, model: str = "m") -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"q{i}"}]},
        }
        for i in range(n)
    ]
    return b"\n".join(json.dumps(line).encode() for line in lines) + b"\n"


async def chunks_of(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def new_batch(store: RedisBatchStore, files: S3FileStore, team: str, n: int) -> Batch:
    stored = await files.create(
        team=team, filename="in.jsonl", purpose="batch", chunks=chunks_of(batch_file(n)),
        max_bytes=10**6,
    )  # fmt: skip
    now = int(time.time())
    batch = Batch(
        id=f"batch_{uuid.uuid4().hex}", endpoint="/v1/chat/completions",
        input_file_id=stored.id, completion_window="24h", status="validating",
        created_at=now, expires_at=now + 3600,
    )  # fmt: skip
    await store.create(batch, team)
    return batch


def result(batch: Batch, index: int, *, ok: bool = True) -> BatchResultEvent:
    ref = BatchLineRef(batch_id=batch.id, line=index, custom_id=f"req-{index}")
    common = {
        "request_id": line_id(batch.id, index),
        "batch": ref,
        "model": "m",
        "finished_at": time.time(),
        "usage": UsageCounts(prompt_tokens=5, completion_tokens=2),
    }
    if ok:
        return BatchResultEvent(text=f"answer {index}", finish_reason="stop", **common)
    return BatchResultEvent(error_code="engine_error", error_message="boom", **common)


async def read_batch_jobs(bootstrap: str, pool: str, *, distinct: int) -> list[InferenceJob]:
    """The pool's batch topic from the start, until ``distinct`` request ids have been read."""
    consumer = AIOKafkaConsumer(
        catalog.job_topic(pool, "batch"), bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
    )  # fmt: skip
    await consumer.start()
    try:
        jobs: list[InferenceJob] = []
        async with asyncio.timeout(15):
            while len({j.request_id for j in jobs}) < distinct:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    jobs += [InferenceJob.model_validate_json(r.value or b"") for r in records]
        return jobs
    finally:
        await consumer.stop()


async def read_file(files: S3FileStore, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) async for line in iter_lines(files.read(file_id)) if line]


async def test_record_line_counts_each_line_once_and_transitions_compare_and_set(
    redis: Redis, files: S3FileStore
) -> None:
    store = RedisBatchStore(redis)
    batch = await new_batch(store, files, "team-a", 3)
    assert not await store.transition(batch.id, "completed", ("in_progress",))
    assert await store.transition(batch.id, "in_progress", ("validating",))
    await store.update(batch.id, total=3)
    first = await store.record_line(batch.id, 0, True, b"1x")
    again = await store.record_line(batch.id, 0, False, b"0y")
    assert (first.new, first.completed, first.failed) == (True, 1, 0)
    assert (again.new, again.completed, again.failed) == (False, 1, 0)
    assert await store.recorded_lines(batch.id, [0, 1]) == [b"1x", None]
    other = await new_batch(store, files, "team-b", 1)
    page, more = await store.list_for_team("team-a")
    assert [b.batch.id for b in page] == [batch.id] and not more
    assert other.id in await store.active()


async def test_collector_records_duplicates_once_survives_a_restart_and_finalizes(
    redis: Redis, files: S3FileStore, kafka_bootstrap: str, producer: KafkaProducer
) -> None:
    store = RedisBatchStore(redis)
    batch = await new_batch(store, files, "team-a", 6)
    await store.transition(batch.id, "in_progress", ("validating",))
    await store.update(batch.id, total=6)
    sink = KafkaResultSink(producer)
    group = f"collector-{uuid.uuid4().hex[:8]}"
    finalizer = BatchFinalizer(store, files, "test", lease_s=30)

    async def collect_until(recorded: int) -> ResultCollector:
        # The batch service's results subscriber, in a group of the test's own.
        stream = dataclasses.replace(BATCH_RESULTS, group=group)
        streams = kafka_broker(kafka_bootstrap, "test")
        collector = ResultCollector(store, finalizer)
        subscribe(streams, stream, collector.handle)
        await streams.start()
        try:
            await eventually(
                lambda: store.get(batch.id),
                lambda s: (
                    s is not None
                    and s.batch.request_counts.completed + s.batch.request_counts.failed >= recorded
                ),
                within=20,
            )
        finally:
            # The collector dies: its subscriber stops (between records), and whatever it
            # had not committed is read again by the next one.
            await asyncio.wait_for(streams.stop(), 30)
            await asyncio.wait_for(collector.drain(), 15)
        return collector

    for index in (0, 1, 2):
        await sink.publish(result(batch, index))
    await sink.publish(result(batch, 1))  # a redelivery
    await collect_until(3)  # then the collector dies
    await sink.publish(result(batch, 3, ok=False))
    await sink.publish(result(batch, 0))  # a replay of a recorded line
    await sink.publish(result(batch, 4))
    await sink.publish(result(batch, 5))
    await collect_until(6)

    done = await eventually(
        lambda: store.get(batch.id), lambda s: s is not None and s.batch.status == "completed", 20
    )
    assert done is not None
    assert done.batch.request_counts.model_dump() == {"completed": 5, "failed": 1, "total": 6}
    assert done.batch.finalizing_at is not None and done.batch.completed_at is not None
    output = await read_file(files, done.batch.output_file_id)
    assert [line["custom_id"] for line in output] == ["req-0", "req-1", "req-2", "req-4", "req-5"]
    assert output[0]["response"]["status_code"] == 200
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "answer 0"
    assert output[0]["response"]["body"]["usage"]["total_tokens"] == 7
    errors = await read_file(files, done.batch.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("req-3", "engine_error")]
    owner = await files.get(done.batch.output_file_id or "")
    assert owner is not None and owner.team == "team-a" and owner.purpose == "batch_output"


class FlakyQueue(KafkaJobQueue):
    """Fails once when asked to produce line ``fail_at`` (a fan-out dying mid-way)."""

    def __init__(self, producer: KafkaProducer, fail_at: str) -> None:
        super().__init__(producer)
        self._fail_at: str | None = fail_at

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> Any:
        if job.request_id == self._fail_at:
            self._fail_at = None
            raise ConnectionError("broker went away")
        return await super().submit(job, partition=partition)


async def test_fanout_validates_then_resumes_after_a_crash_without_skipping_a_line(
    redis: Redis, files: S3FileStore, kafka_bootstrap: str, producer: KafkaProducer, pool: str
) -> None:
    store = RedisBatchStore(redis)
    batch = await new_batch(store, files, "team-a", 10)
    deployment = Deployment(name="m", path="unused", pool=pool, max_model_len=512)
    renderer = ChatRenderer({"m@1": CharTokenizer()})
    finalizer = BatchFinalizer(store, files, "test", lease_s=30)
    queue = FlakyQueue(producer, fail_at=line_id(batch.id, 7))
    fanout = BatchFanout(
        store, files, queue, RedisBacklog(redis), renderer, ServedModels([deployment]), finalizer,
        max_requests=100, chunk=3,
    )  # fmt: skip
    with pytest.raises(ConnectionError):
        await fanout.handle(batch.id)
    crashed = await store.get(batch.id)
    assert crashed is not None
    assert crashed.batch.status == "in_progress" and crashed.cursor == 6
    assert crashed.batch.request_counts.total == 10 and crashed.batch.model == "m"
    await fanout.handle(batch.id)  # the control event is redelivered
    resumed = await store.get(batch.id)
    assert resumed is not None and resumed.cursor == 10

    jobs = await read_batch_jobs(kafka_bootstrap, pool, distinct=10)
    lines = sorted(j.batch.line for j in jobs if j.batch is not None)
    # Every line once, except those of the chunk that was cut (6..8) which may come twice.
    assert sorted(set(lines)) == list(range(10))
    assert all(lines.count(i) == 1 for i in (*range(6), 9))
    job = next(j for j in jobs if j.batch is not None and j.batch.line == 0)
    assert job.tier == "batch" and job.reply_to == catalog.RESULTS_TOPIC
    assert job.batch is not None and job.batch.custom_id == "req-0"
    assert job.deadline == batch.expires_at
    # the team's interactive requests carry this salt too: a batch shares its team's cache
    assert job.cache_salt == deployment.cache_salt("team-a") != deployment.cache_salt("team-b")


async def test_a_batch_cancelled_before_it_was_validated_ends_cancelled_with_nothing_produced(
    redis: Redis, files: S3FileStore, producer: KafkaProducer, pool: str
) -> None:
    # The cancel can land before the batch service reads the batch's creation event.
    store = RedisBatchStore(redis)
    batch = await new_batch(store, files, "team-a", 3)
    assert await store.transition(batch.id, "cancelling", ("validating",))
    fanout = BatchFanout(
        store, files, KafkaJobQueue(producer), RedisBacklog(redis),
        ChatRenderer({"m@1": CharTokenizer()}),
        ServedModels([Deployment(name="m", path="unused", pool=pool)]),
        BatchFinalizer(store, files, "test", 30), max_requests=100, chunk=3,
    )  # fmt: skip
    await fanout.handle(batch.id)
    ended = await store.get(batch.id)
    assert ended is not None and ended.batch.status == "cancelled"
    assert ended.batch.request_counts.total == 0 and ended.cursor == 0


async def test_invalid_file_fails_the_batch_with_line_numbers(
    redis: Redis, files: S3FileStore, producer: KafkaProducer, pool: str
) -> None:
    store = RedisBatchStore(redis)
    data = batch_file(2) + b"{oops\n" + batch_file(1, model="unknown")
    stored = await files.create(
        team="t", filename="bad.jsonl", purpose="batch", chunks=chunks_of(data), max_bytes=10**6
    )
    now = int(time.time())
    batch = Batch(
        id=f"batch_{uuid.uuid4().hex}", endpoint="/v1/chat/completions",
        input_file_id=stored.id, completion_window="24h", status="validating", created_at=now,
    )  # fmt: skip
    await store.create(batch, "t")
    deployment = Deployment(name="m", path="unused", pool=pool)
    fanout = BatchFanout(
        store, files, KafkaJobQueue(producer), RedisBacklog(redis),
        ChatRenderer({"m@1": CharTokenizer()}), ServedModels([deployment]),
        BatchFinalizer(store, files, "test", 30), max_requests=100, chunk=3,
    )  # fmt: skip
    await fanout.handle(batch.id)
    failed = await store.get(batch.id)
    assert failed is not None and failed.batch.status == "failed"
    assert failed.batch.failed_at is not None and failed.batch.errors is not None
    assert [(e.line, e.code) for e in failed.batch.errors.data] == [
        (3, "invalid_json_line"),
        (4, "duplicate_custom_id"),
        (4, "model_not_found"),
    ]
    assert batch.id not in await store.active()


async def test_fanout_reserves_each_lines_quota_and_waits_for_the_bucket(
    redis: Redis, files: S3FileStore, kafka_bootstrap: str, producer: KafkaProducer, pool: str
) -> None:
    # Lines name no max_tokens, so each reserves its whole context: 512 tokens. The team's
    # minute holds three of them; the other three wait for the bucket to refill (on a clock
    # that the waits themselves advance, so the test takes no minute).
    team = f"team-q-{uuid.uuid4().hex[:6]}"
    store = RedisBatchStore(redis)
    batch = await new_batch(store, files, team, 6)
    deployment = Deployment(name="m", path="unused", pool=pool, max_model_len=512)
    now_ms = [time.time_ns() // 1_000_000]
    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)
        now_ms[0] += int(seconds * 1000)

    policy = TeamPolicy(weight=2.0, tokens_per_minute=3 * 512 + 100)
    quota = LineQuota(RedisTokenBucket(redis, clock_ms=lambda: now_ms[0]), {team: policy}, wait)
    fanout = BatchFanout(
        store, files, KafkaJobQueue(producer), RedisBacklog(redis),
        ChatRenderer({"m@1": CharTokenizer()}), ServedModels([deployment]),
        BatchFinalizer(store, files, "test", lease_s=30), max_requests=100, chunk=4, quota=quota,
    )  # fmt: skip
    await fanout.handle(batch.id)

    jobs = await read_batch_jobs(kafka_bootstrap, pool, distinct=6)
    assert len(jobs) == 6
    assert all(job.reserved_tokens == 512 and job.team_weight == 2.0 for job in jobs)
    # Three lines found the bucket full; each of the others waited for about 512 tokens of
    # refill at 1636 tokens a minute (about 19 s), none was refused.
    assert len(waits) >= 3 and 45 <= sum(waits) <= 75, waits
    finished = await store.get(batch.id)
    assert finished is not None and finished.cursor == 6
