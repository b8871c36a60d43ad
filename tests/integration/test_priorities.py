"""Priority classes on a real broker and Redis: interactive overtakes batch, preemption
re-queues a batch line that still completes exactly once, an expired job is not run."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from schemas.messages import DeadLetter, ErrorEvent, FinishEvent, TokenEvent
from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from tests.topic_reading import read_until
from topics import catalog
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_relay import RedisReplyRelay

pytestmark = pytest.mark.integration


async def test_interactive_overtakes_a_batch_backlog_and_preempts_it(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    # One sequence slot: the engine can run one job at a time.
    engine = ScriptedEngine(tokens=50, max_num_seqs=1, step_s=0.02)  # a job runs ~1 s
    queue = KafkaJobQueue(producer)
    batch = [f"batch-{i}" for i in range(4)]
    for rid in batch:
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid, tier="batch"))
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    await asyncio.wait_for(engine.generating.wait(), 30)  # the first batch job is running
    interactive = ["inter-0", "inter-1"]
    for rid in interactive:
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid))
    results = {rid: await collect(relay, rid) for rid in interactive + batch}
    worker.drain()
    await asyncio.wait_for(task, 30)

    # Both interactive jobs started before any batch job that was still waiting.
    first_batch_restart = min(i for i, rid in enumerate(engine.order) if rid in batch and i > 0)
    starts = {rid: engine.order.index(rid) for rid in interactive}
    assert all(pos < first_batch_restart for pos in starts.values()), engine.order
    # The running batch job was preempted (aborted and re-queued): it ran twice ...
    preempted = engine.order[0]
    assert preempted in batch and engine.calls[preempted] == 2
    # ... yet every batch caller saw exactly one whole answer and one finish.
    for rid in batch:
        events = results[rid]
        tokens = [e for e in events if isinstance(e, TokenEvent)]
        assert len(tokens) == 1 and tokens[0].num_tokens == 50
        assert isinstance(events[-1], FinishEvent) and events[-1].usage.completion_tokens == 50
    for rid in interactive:
        assert isinstance(results[rid][-1], FinishEvent)


async def test_expired_job_is_not_run(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    engine = ScriptedEngine(tokens=2)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    relay.open("late")
    relay.open("fine")
    queue = KafkaJobQueue(producer)
    await queue.submit(make_job(pool, relay, "late", deadline=time.time() - 1))
    await queue.submit(make_job(pool, relay, "fine"))
    late = await collect(relay, "late")
    fine = await collect(relay, "fine")
    worker.drain()
    await asyncio.wait_for(task, 30)
    assert len(late) == 1 and isinstance(late[0], ErrorEvent)
    assert late[0].code == "deadline_exceeded"
    assert isinstance(fine[-1], FinishEvent)
    assert "late" not in engine.calls and engine.calls["fine"] == 1


async def test_batch_cap_holds_while_a_fetch_brings_many_batch_jobs(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    # Plenty of slots, a cap of 2 batch jobs: a fetch that returns ten batch jobs at once must
    # still start only two (jobs reach the engine a few Redis round trips after they start).
    engine = ScriptedEngine(tokens=5, max_num_seqs=8, step_s=0.01)
    queue = KafkaJobQueue(producer)
    batch = [f"capped-{i}" for i in range(10)]
    for rid in batch:
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid, tier="batch"))
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, batch_max_in_flight=2)
    results = {rid: await collect(relay, rid) for rid in batch}
    worker.drain()
    await asyncio.wait_for(task, 30)
    assert all(isinstance(events[-1], FinishEvent) for events in results.values())
    assert engine.peak_running == 2, engine.peak_running


async def test_records_that_are_not_jobs_go_to_the_dead_letter_topic_and_the_partition_flows(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    engine = ScriptedEngine(tokens=2)
    topic = catalog.job_topic(pool, "interactive")
    future = make_job(pool, relay, "from-the-future").model_dump(mode="json")
    future["schema_version"] = 2
    # Same partition for all three: the good job comes after the two bad records.
    await producer.send(topic, b"\xff not json", partition=0)
    await producer.send(topic, json.dumps(future).encode(), partition=0)
    relay.open("from-the-future")
    relay.open("after-poison")
    await KafkaJobQueue(producer).submit(make_job(pool, relay, "after-poison"), partition=0)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    events = await collect(relay, "after-poison")
    assert isinstance(events[-1], FinishEvent)
    # Both bad records were dead-lettered (awaited, in offset order) before the good job,
    # behind them in the partition, was even accepted: they are on the topic by now.
    letters = await read_until(
        kafka_bootstrap,
        catalog.DEAD_TOPIC,
        DeadLetter.model_validate_json,
        lambda letter: letter.topic == topic,
        within=15,
        at_least=2,
    )
    worker.drain()
    await asyncio.wait_for(task, 30)
    by_offset = sorted(letters, key=lambda letter: letter.offset)
    assert [(d.reason, d.partition) for d in by_offset] == [
        ("unparseable", 0),
        ("unknown_schema_version", 0),
    ]
    assert base64.b64decode(by_offset[0].payload_b64) == b"\xff not json"
    assert by_offset[1].request_id == "from-the-future"
    assert "from-the-future" not in engine.calls
    # Its caller is told at once (the record still names its gateway), not at its deadline.
    told = await collect(relay, "from-the-future")
    assert len(told) == 1 and isinstance(told[0], ErrorEvent)
    assert told[0].code == "job_unreadable"
