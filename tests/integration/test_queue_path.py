"""The queue path on a real broker (Tansu) and real Redis (Valkey).

A job produced by the gateway's service is consumed by a worker, its events reach the right
waiting request, and offsets are committed only after terminal events.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from schemas.messages import (
    FinishEvent,
    TokenEvent,
    UsageRecord,
)
from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from tests.polling import eventually
from tests.topic_reading import read_until
from topics import catalog
from topics.counted_queue import AnnouncedJobQueue
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_relay import RedisReplyRelay
from topics.redis_wake import RedisJobWake

pytestmark = pytest.mark.integration


async def _committed(kafka: str, pool: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka, group_id=catalog.worker_group(pool))
    await consumer.start()
    try:
        committed: int | None = await consumer.committed(tp)
        return committed
    finally:
        await consumer.stop()


async def test_events_reach_the_right_waiting_request(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    engine = ScriptedEngine(tokens=3)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    queue = KafkaJobQueue(producer)
    ids = [f"req-{i}" for i in range(4)]
    for rid in ids:
        relay.open(rid)  # subscribed before produced
        await queue.submit(make_job(pool, relay, rid))
    results = await asyncio.gather(*(collect(relay, rid) for rid in ids))
    for rid, events in zip(ids, results, strict=True):
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert [t.text for t in tokens] == [f"{rid}:{i} " for i in range(3)]
        assert [t.seq for t in tokens] == [0, 1, 2]
        finish = events[-1]
        assert isinstance(finish, FinishEvent) and finish.finish_reason == "length"
        assert finish.usage.completion_tokens == 3 and finish.usage.prompt_tokens == 3
    worker.drain()
    await asyncio.wait_for(task, 30)
    assert all(engine.calls[rid] == 1 for rid in ids)


async def test_an_idle_worker_stops_polling_until_a_job_is_announced(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str,
    redis_url: str, redis: Redis,
) -> None:  # fmt: skip
    # Idle, it would fetch on its own only every 60 s: both jobs are served long before
    # that only because the second one is announced.
    engine = ScriptedEngine(tokens=2)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, idle_fetch_interval_s=60)
    await asyncio.wait_for(worker.ready.wait(), 60)
    loop = worker.pull_loop
    assert loop is not None

    async def state() -> tuple[bool, bool]:
        assert loop is not None
        return bool(loop.assigned()), loop.polling

    def paused(value: tuple[bool, bool]) -> bool:
        return value[0] and not value[1]

    await eventually(state, paused, within=30)
    for rid in ("req-quiet", "req-announced"):
        relay.open(rid)
    await KafkaJobQueue(producer).submit(make_job(pool, relay, "req-quiet"))
    assert not loop.polling  # produced without an announcement: nothing wakes the worker
    announced = AnnouncedJobQueue(KafkaJobQueue(producer), RedisJobWake(redis))
    await announced.submit(make_job(pool, relay, "req-announced"))
    results = await asyncio.gather(*(collect(relay, r) for r in ("req-quiet", "req-announced")))
    assert all(isinstance(events[-1], FinishEvent) for events in results)
    await eventually(state, paused, within=30)  # idle again: paused again
    worker.drain()
    await asyncio.wait_for(task, 30)


async def test_a_busy_worker_stops_polling_once_its_partitions_are_empty(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str,
    redis_url: str, redis: Redis,
) -> None:  # fmt: skip
    # While a job generates, nothing new is in the partitions until the next announcement:
    # the worker sends the broker no fetch, and still starts an announced job beside it.
    engine = ScriptedEngine(tokens=2, hold={"req-long"})
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, idle_fetch_interval_s=60)
    await asyncio.wait_for(worker.ready.wait(), 60)
    loop = worker.pull_loop
    assert loop is not None
    announced = AnnouncedJobQueue(KafkaJobQueue(producer), RedisJobWake(redis))

    async def state() -> tuple[int, bool]:
        assert loop is not None
        return loop.in_flight, loop.polling

    for rid in ("req-long", "req-next"):
        relay.open(rid)
    await announced.submit(make_job(pool, relay, "req-long"))
    await eventually(state, lambda s: s == (1, False), within=30)  # generating, not polling
    await announced.submit(make_job(pool, relay, "req-next"))
    events = await collect(relay, "req-next")
    assert isinstance(events[-1], FinishEvent)
    await eventually(state, lambda s: s == (1, False), within=30)
    assert "req-long" in engine.running
    task.cancel()  # the held job never ends
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_usage_records_land_on_the_usage_topic(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    engine = ScriptedEngine(tokens=2)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    rid = f"usage-{uuid.uuid4().hex[:6]}"
    relay.open(rid)
    await KafkaJobQueue(producer).submit(make_job(pool, relay, rid))
    await collect(relay, rid)
    worker.drain()
    await asyncio.wait_for(task, 30)
    found = await read_until(
        kafka_bootstrap,
        catalog.USAGE_TOPIC,
        UsageRecord.model_validate_json,
        lambda u: u.request_id == rid,
    )
    assert len(found) == 1
    assert (found[0].completion_tokens, found[0].prompt_tokens, found[0].team) == (2, 3, "t")


async def test_offsets_commit_only_after_terminal_events(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    tp = TopicPartition(catalog.job_topic(pool, "interactive"), 0)
    ids = ["a", "b", "c"]
    held = "b"
    engine = ScriptedEngine(tokens=2, hold={held})
    _, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    queue = KafkaJobQueue(producer)
    for rid in ids:
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid), partition=0)
    await collect(relay, "a")
    await collect(relay, "c")
    # The worker commits on its next loop turn: a and c are done, b (offset 1) is not.
    await eventually(lambda: _committed(kafka_bootstrap, pool, tp), lambda c: c == 1, 10)
    assert engine.calls[held] == 1 and held in engine.running

    task.cancel()  # a crash: the held job never finished, so offset 1 stays uncommitted
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _committed(kafka_bootstrap, pool, tp) == 1

    engine2 = ScriptedEngine(tokens=2)
    worker2, task2 = start_worker(pool, kafka_bootstrap, redis_url, engine2)
    events = await collect(relay, held)
    assert isinstance(events[-1], FinishEvent)
    await eventually(lambda: _committed(kafka_bootstrap, pool, tp), lambda c: c == 3, 10)
    worker2.drain()
    await asyncio.wait_for(task2, 30)
    # Nothing lost (b ran again), nothing finished re-run (c came back after b but was skipped).
    assert engine2.calls == {held: 1}


async def test_drain_finishes_the_running_stream_commits_and_fetches_nothing_more(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    tp = TopicPartition(catalog.job_topic(pool, "interactive"), 0)
    engine = ScriptedEngine(tokens=40, step_s=0.02)  # about 0.8 s of streaming
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    queue = KafkaJobQueue(producer)
    relay.open("streaming")
    await queue.submit(make_job(pool, relay, "streaming"), partition=0)
    await asyncio.wait_for(engine.generating.wait(), 30)
    worker.drain()  # what SIGTERM does
    await queue.submit(make_job(pool, relay, "after-drain"), partition=0)
    events = await collect(relay, "streaming")
    await asyncio.wait_for(task, 30)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) == 40 and isinstance(events[-1], FinishEvent)  # the stream was not cut
    assert "after-drain" not in engine.calls  # nothing new was started
    assert await _committed(kafka_bootstrap, pool, tp) == 1  # left for the next owner
