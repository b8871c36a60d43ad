"""`llmq replay` on a real broker (Tansu) and Redis (Valkey): ranges, skips, dead letters.

What arrived is read back with a plain aiokafka consumer, to each partition's highwater, so
"exactly these jobs" means nothing else was produced either.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis
from structlog.testing import capture_logs
from typer.testing import CliRunner

from llmq.cli import app
from llmq.replay import Replayer, ReplayOptions, ReplaySummary
from schemas.messages import DeadLetter, InferenceJob, SamplingSettings
from topics import catalog
from topics.counted_queue import CountedJobQueue
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.kafka_replay import KafkaTopicReader
from topics.ports import JobReceipt
from topics.redis_backlog import RedisBacklog
from topics.redis_relay import RedisJobLedger

pytestmark = pytest.mark.integration

PARTITIONS = (0, 1)
"""The `pool` fixture creates every topic with two partitions."""


def make_job(pool: str, request_id: str, **fields: Any) -> InferenceJob:
    values: dict[str, Any] = dict(
        request_id=request_id, team="t", model="m", pool=pool, prompt_token_ids=(1, 2, 3),
        sampling=SamplingSettings(max_tokens=3), created_at=time.time(),
        deadline=time.time() + 3600, reply_to="llmq:reply:test", cache_salt=f"salt-{request_id}",
    )  # fmt: skip
    values.update(fields)
    return InferenceJob(**values)


async def produce(
    producer: KafkaProducer, pool: str, ids: list[str], partition: int
) -> dict[str, JobReceipt]:
    queue = KafkaJobQueue(producer)
    return {rid: await queue.submit(make_job(pool, rid), partition=partition) for rid in ids}


async def read_topic(
    bootstrap: str, topic: str, partitions: tuple[int, ...] = PARTITIONS
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of the partitions, read up to their highwater (no group, no commits)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=10)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(15):
            while True:
                batch = await consumer.getmany(*tps, timeout_ms=100)
                found.extend(r for records in batch.values() for r in records)
                ends = [consumer.highwater(tp) for tp in tps]
                positions = [await consumer.position(tp) for tp in tps]
                if None not in ends and all(p >= e for p, e in zip(positions, ends, strict=True)):
                    return found
    finally:
        await consumer.stop()


def replayed(records: list[ConsumerRecord[bytes, bytes]]) -> dict[str, tuple[int, InferenceJob]]:
    """Request id -> (partition, job) of every replayed job among `records`."""
    jobs = [(r.partition, InferenceJob.model_validate_json(r.value or b"")) for r in records]
    return {job.request_id: (p, job) for p, job in jobs if job.replay is not None}


async def replay(bootstrap: str, redis: Redis, **options: Any) -> ReplaySummary:
    async with KafkaTopicReader(bootstrap) as reader:
        producer = KafkaProducer(bootstrap, client_id="test-replay")
        await producer.start()
        try:
            queue = CountedJobQueue(KafkaJobQueue(producer), RedisBacklog(redis))  # as the command
            replayer = Replayer(ReplayOptions(**options), reader, queue, RedisJobLedger(redis))
            return await replayer.run()
        finally:
            await producer.stop()


async def test_an_offset_range_replays_exactly_the_unfinished_jobs_once(
    pool: str, producer: KafkaProducer, redis: Redis, kafka_bootstrap: str
) -> None:
    topic = catalog.job_topic(pool, "interactive")
    tag = uuid.uuid4().hex[:6]
    ids = {p: [f"{tag}-p{p}-{i}" for i in range(4)] for p in PARTITIONS}
    receipts = {
        **await produce(producer, pool, ids[0], 0),
        **await produce(producer, pool, ids[1], 1),
    }
    assert [receipts[rid].offset for rid in ids[1]] == [0, 1, 2, 3]
    ledger = RedisJobLedger(redis)
    for rid in (ids[0][1], ids[1][2]):
        await ledger.mark_finished(rid)

    summary = await replay(kafka_bootstrap, redis, topic=topic, from_offset=1, to_offset=4)

    expected = {ids[0][2], ids[0][3], ids[1][1], ids[1][3]}
    assert (summary.scanned, summary.sent, summary.skipped["finished"]) == (6, 4, 2)
    # Counted into the admission backlog as the gateway counts its jobs (3 prompt tokens each).
    assert await RedisBacklog(redis).queued(pool, "interactive") == 4 * 3
    records = await read_topic(kafka_bootstrap, topic)
    assert len(records) == 8 + 4
    found = replayed(records)
    assert set(found) == expected
    for rid, (partition, job) in found.items():
        source = receipts[rid]
        assert job.replay is not None and job.replay.replay_id == summary.replay_id
        assert partition == source.partition == job.replay.source_partition
        assert (job.replay.source_topic, job.replay.source_offset) == (topic, source.offset)
        assert not job.replay.force
        assert job.cache_salt == f"salt-{rid}"  # a replay shares its team's prefix cache

    for rid in expected:  # the workers ran the replayed jobs
        await ledger.mark_finished(rid)
    again = await replay(kafka_bootstrap, redis, topic=topic, from_offset=1, to_offset=4)
    assert (again.scanned, again.sent, again.skipped["finished"]) == (6, 0, 6)
    assert len(await read_topic(kafka_bootstrap, topic)) == 12


async def test_a_time_range_selects_by_record_timestamps(
    pool: str, producer: KafkaProducer, redis: Redis, kafka_bootstrap: str
) -> None:
    topic = catalog.job_topic(pool, "interactive")
    first = [f"early-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    second = [f"late-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    await produce(producer, pool, first[:2], 0)
    await produce(producer, pool, first[2:], 1)
    await asyncio.sleep(0.05)  # only a gap between the two groups' timestamps
    await produce(producer, pool, second[:1], 0)
    await produce(producer, pool, second[1:], 1)
    stamps = {
        InferenceJob.model_validate_json(r.value or b"").request_id: r.timestamp
        for r in await read_topic(kafka_bootstrap, topic)
    }
    assert max(stamps[rid] for rid in first) < min(stamps[rid] for rid in second)
    boundary = min(stamps[rid] for rid in second) / 1000

    before = await replay(kafka_bootstrap, redis, topic=topic, until=boundary, dry_run=True)
    assert (before.scanned, before.selected, before.sent) == (3, 3, 0)
    summary = await replay(kafka_bootstrap, redis, topic=topic, since=boundary)

    assert (summary.scanned, summary.sent) == (3, 3)
    assert set(replayed(await read_topic(kafka_bootstrap, topic))) == set(second)


async def test_the_command_in_a_dry_run_counts_and_sends_nothing(
    pool: str,
    producer: KafkaProducer,
    kafka_bootstrap: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Keep the session's logging as it is, and the command's logs off its stdout.
    monkeypatch.setattr("llmq.logging.configure_logging", lambda *a, **k: None)
    topic = catalog.job_topic(pool, "interactive")
    await produce(producer, pool, [f"dry-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)], 1)
    await produce(producer, pool, [f"dry-{uuid.uuid4().hex[:6]}-p0"], 0)
    args = ["replay", "--topic", topic, "--partition", "1", "--dry-run"]
    env = {"LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap, "LLMQ_REDIS_URL": redis_url}
    with capture_logs():
        # The command runs its own event loop: give it a thread of its own.
        result = await asyncio.to_thread(CliRunner(env=env).invoke, app, args)

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:4] == ["scanned: 3", "selected: 3", "sent: 0", "would_send: 3"]
    assert "duplicate_in_range: 0" in lines and "unreadable: 0" in lines and len(lines) == 10
    assert len(await read_topic(kafka_bootstrap, topic)) == 4

    unknown = ["replay", "--topic", "llmq.jobs.nosuchpool.batch"]
    result = await asyncio.to_thread(CliRunner(env=env).invoke, app, unknown)
    assert result.exit_code == 2 and "unknown topic" in result.stderr
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # asking about a missing topic must not create it (Tansu auto-creates on metadata)
        assert unknown[-1] not in await admin.list_topics()
    finally:
        await admin.close()


async def test_a_dead_letter_goes_back_to_its_original_topic_and_partition(
    pool: str, producer: KafkaProducer, redis: Redis, kafka_bootstrap: str
) -> None:
    topic = catalog.job_topic(pool, "interactive")
    rid = f"dead-{uuid.uuid4().hex[:6]}"
    payload = make_job(pool, rid).to_bytes()

    def letter(raw: bytes) -> bytes:
        return DeadLetter(
            reason="engine_failed", detail="RuntimeError", request_id=rid, topic=topic,
            partition=1, offset=5, payload_b64=base64.b64encode(raw).decode(),
            failed_at=time.time(),
        ).to_bytes()  # fmt: skip

    good = await producer.send(catalog.DEAD_TOPIC, letter(payload), partition=0)
    bad = await producer.send(catalog.DEAD_TOPIC, letter(b"\xffnot json"), partition=0)
    assert bad.offset == good.offset + 1

    summary = await replay(
        kafka_bootstrap, redis, dead=True, partitions=(0,),
        from_offset=good.offset, to_offset=bad.offset + 1,
    )  # fmt: skip

    assert (summary.scanned, summary.sent, summary.skipped["unreadable"]) == (2, 1, 1)
    (partition, job), *_ = replayed(await read_topic(kafka_bootstrap, topic)).values()
    assert partition == 1 and job.request_id == rid and job.replay is not None
    assert (job.replay.source_topic, job.replay.source_offset) == (catalog.DEAD_TOPIC, good.offset)
    assert job.model_copy(update={"replay": None}) == InferenceJob.model_validate_json(payload)


async def test_the_reader_stops_at_the_highwater_seen_when_it_opened(
    pool: str, kafka_bootstrap: str
) -> None:
    """Several records per batch (where Tansu's `end_offsets()` undercounts), and records
    produced after `open()`: exactly the first ones are read, and the read ends."""
    topic = catalog.job_topic(pool, "batch")
    batching = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    await batching.start()
    try:
        sent = [await batching.send(topic, f"r{i}".encode(), partition=0) for i in range(20)]
        assert [(await s).offset for s in sent] == list(range(20))
        async with KafkaTopicReader(kafka_bootstrap) as reader:
            spans = await reader.open(topic)
            assert spans == {0: (0, 20), 1: (0, 0)}
            later = [await batching.send(topic, b"later", partition=0) for _ in range(5)]
            await asyncio.gather(*later)
            read: list[int] = []
            async with asyncio.timeout(15):
                values = [r.value async for r in reader.records(on_read=read.append)]
    finally:
        await batching.stop()
    assert values == [f"r{i}".encode() for i in range(20)] and sum(read) == 20
