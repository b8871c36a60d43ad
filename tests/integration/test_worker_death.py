"""A worker dying mid-load, on a real broker (Tansu) and real Redis (Valkey).

What each caller sees is decided by what it had already seen: a job whose caller saw no token
runs again invisibly; a stream that had sent tokens ends with `stream_interrupted` and its
partial usage; every request is billed exactly once. A job that keeps failing the engine goes
to the dead-letter topic instead of running forever.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from schemas.messages import (
    CancelEvent,
    DeadLetter,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
    UsageRecord,
)
from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from tests.polling import eventually
from tests.topic_reading import read_until
from topics import catalog
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.ports import StartChecks
from topics.redis_job_start import RedisJobStart
from topics.redis_relay import RedisCancelBus, RedisReplicaDirectory, RedisReplyRelay
from workers.worker import WorkerUnhealthy

pytestmark = pytest.mark.integration

ReplyEvent = TokenEvent | FinishEvent | ErrorEvent


async def _received(relay: RedisReplyRelay, request_id: str, count: int) -> list[ReplyEvent]:
    """The first `count` events of a request (it need not have ended)."""
    sub = relay._requests[request_id]
    async with asyncio.timeout(30):
        return [await sub.next_event() for _ in range(count)]


async def _usage(kafka: str, ids: set[str]) -> dict[str, list[UsageRecord]]:
    records = await read_until(
        kafka,
        catalog.USAGE_TOPIC,
        UsageRecord.model_validate_json,
        lambda r: r.request_id in ids,
        at_least=len(ids),
    )
    by_id: dict[str, list[UsageRecord]] = {rid: [] for rid in ids}
    for record in records:
        by_id[record.request_id].append(record)
    return by_id


async def test_a_dead_worker_reruns_unseen_jobs_and_interrupts_seen_streams(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    streamed, buffered, queued = f"streamed-{tag}", f"buffered-{tag}", f"queued-{tag}"
    # Two slots: the streamed and the non-streaming job stall after 2 tokens each; the third
    # job waits in the partition (or the worker's buffer), never started.
    engine = ScriptedEngine(tokens=3, max_num_seqs=2, stall_after={streamed: 2, buffered: 2})
    _, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    queue = KafkaJobQueue(producer)
    for rid, stream in ((streamed, True), (buffered, False), (queued, True)):
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid, stream=stream), partition=0)

    seen = await _received(relay, streamed, 2)
    assert [e.num_tokens for e in seen if isinstance(e, TokenEvent)] == [1, 1]
    await _received(relay, buffered, 2)  # a gateway buffers these: its caller saw nothing
    await eventually(lambda: _async(engine.running), lambda r: r == {streamed, buffered}, 10)

    task.cancel()  # the worker dies: nothing it held was committed
    with pytest.raises(asyncio.CancelledError):
        await task

    engine2 = ScriptedEngine(tokens=3)
    worker2, task2 = start_worker(pool, kafka_bootstrap, redis_url, engine2, replica="1")
    cut = await collect(relay, streamed)
    assert isinstance(cut[-1], ErrorEvent) and cut[-1].code == "stream_interrupted"
    assert cut[-1].usage.completion_tokens == 2  # exactly what the caller saw
    assert len(cut) == 1  # and no text of a second run

    rerun = await collect(relay, buffered)
    assert isinstance(rerun[-1], FinishEvent)
    assert {e.attempt for e in rerun if isinstance(e, TokenEvent)} == {2}
    assert len([e for e in rerun if isinstance(e, TokenEvent)]) == 3

    late = await collect(relay, queued)
    assert isinstance(late[-1], FinishEvent)
    assert {e.attempt for e in late if isinstance(e, TokenEvent)} == {1}

    assert engine2.calls == {buffered: 1, queued: 1}  # the cut stream was not re-run
    usage = await _usage(kafka_bootstrap, {streamed, buffered, queued})
    assert {rid: len(records) for rid, records in usage.items()} == {
        streamed: 1,
        buffered: 1,
        queued: 1,
    }
    assert usage[streamed][0].finish_reason == "interrupted"
    assert usage[streamed][0].completion_tokens == 2
    assert usage[buffered][0].completion_tokens == 3
    worker2.drain()
    await asyncio.wait_for(task2, 30)


async def test_a_job_that_keeps_failing_is_dead_lettered_and_its_partition_flows(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:6]
    poison, good = f"poison-{tag}", f"good-{tag}"
    engine = ScriptedEngine(tokens=2, fail={poison})
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, max_failed_runs=2)
    queue = KafkaJobQueue(producer)
    for rid in (poison, good):
        relay.open(rid)
        await queue.submit(make_job(pool, relay, rid), partition=0)

    assert isinstance((await collect(relay, good))[-1], FinishEvent)
    ended = await collect(relay, poison)
    assert len(ended) == 1 and isinstance(ended[0], ErrorEvent)
    assert ended[0].code == "engine_failed"
    assert engine.calls[poison] == 2  # two failed runs, then set aside

    letters = await read_until(
        kafka_bootstrap,
        catalog.DEAD_TOPIC,
        DeadLetter.model_validate_json,
        lambda letter: letter.request_id == poison,
    )
    assert [(x.reason, x.attempts) for x in letters] == [("engine_failed", 2)]
    assert letters[0].topic == catalog.job_topic(pool, "interactive")
    worker.drain()
    await asyncio.wait_for(task, 30)


async def _async(value: set[str]) -> set[str]:
    return set(value)


async def test_a_hung_engine_fails_its_probes_and_the_worker_exits_unhealthy(
    pool: str, redis: Redis, kafka_bootstrap: str, redis_url: str
) -> None:
    engine = ScriptedEngine(tokens=2)
    worker, task = start_worker(
        pool, kafka_bootstrap, redis_url, engine,
        health_probe_interval_s=0.2, health_probe_timeout_s=0.3,
    )  # fmt: skip
    await asyncio.wait_for(worker.ready.wait(), 30)
    await eventually(lambda: _async(set(engine.calls)), lambda c: len(c) >= 2, 10)  # probes ran
    assert all(rid.startswith("health-") for rid in engine.calls)
    engine.hung = True  # the engine stops answering: the process itself is fine
    with pytest.raises(WorkerUnhealthy, match="probe failed 2 times"):
        await asyncio.wait_for(task, 30)
    beats = await RedisReplicaDirectory(redis).replicas()
    mine = [b for b in beats if b.replica_id == worker.settings.replica_id]
    assert mine and not mine[0].healthy  # the gateway no longer routes to it


async def test_the_step_watchdog_exits_on_a_stall_and_the_job_runs_elsewhere(
    pool: str, relay: RedisReplyRelay, producer: KafkaProducer, kafka_bootstrap: str, redis_url: str
) -> None:
    stuck = f"stuck-{uuid.uuid4().hex[:6]}"
    engine = ScriptedEngine(tokens=2, hold={stuck})  # holds the job, produces nothing
    _, task = start_worker(pool, kafka_bootstrap, redis_url, engine, watchdog_stall_s=0.5)
    relay.open(stuck)
    await KafkaJobQueue(producer).submit(make_job(pool, relay, stuck), partition=0)
    with pytest.raises(WorkerUnhealthy, match="produced nothing"):
        await asyncio.wait_for(task, 30)

    worker2, task2 = start_worker(pool, kafka_bootstrap, redis_url, ScriptedEngine(tokens=2), "1")
    assert isinstance((await collect(relay, stuck))[-1], FinishEvent)  # uncommitted: re-run
    worker2.drain()
    await asyncio.wait_for(task2, 30)


async def test_a_job_whose_gateway_is_gone_stops_and_bills_only_what_reached_one(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    orphan = f"orphan-{uuid.uuid4().hex[:6]}"
    engine = ScriptedEngine(tokens=50, step_s=0.01)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    # Its gateway restarted: nobody subscribes to the reply channel any more.
    job = make_job(pool, relay, orphan, reply_to=catalog.reply_channel("restarted-gateway"))
    await KafkaJobQueue(producer).submit(job, partition=0)
    usage = await _usage(kafka_bootstrap, {orphan})
    (record,) = usage[orphan]
    assert record.finish_reason == "caller_gone"
    assert record.completion_tokens == 0  # its first token reached nobody: nothing billed
    assert engine.calls[orphan] == 1 and orphan not in engine.running  # aborted, not run on
    worker.drain()
    await asyncio.wait_for(task, 30)


async def test_a_job_its_client_cancels_before_it_reaches_the_engine_is_still_billed_once(
    pool: str,
    producer: KafkaProducer,
    relay: RedisReplyRelay,
    redis: Redis,
    kafka_bootstrap: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cancel lands while the runner still talks to Redis (a slow round trip, held here
    at its start checks): the job ends as cancelled with one usage record, so its quota
    reservation is refunded, and it never starts in the engine."""
    early = f"early-{uuid.uuid4().hex[:6]}"
    reached, release = asyncio.Event(), asyncio.Event()
    begin = RedisJobStart.begin

    async def slow_begin(self: RedisJobStart, job: InferenceJob, key: str) -> StartChecks:
        if early in key:
            reached.set()
            await release.wait()  # held until the cancel has landed (never, here)
        return await begin(self, job, key)

    monkeypatch.setattr(RedisJobStart, "begin", slow_begin)
    engine = ScriptedEngine(tokens=3)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine)
    relay.open(early)
    job = make_job(pool, relay, early, reserved_tokens=100)
    await KafkaJobQueue(producer).submit(job, partition=0)
    await asyncio.wait_for(reached.wait(), 30)
    await RedisCancelBus(redis).cancel(CancelEvent(request_id=early))
    await RedisCancelBus(redis).cancel(CancelEvent(request_id=early))  # a repeat changes nothing

    (record,) = (await _usage(kafka_bootstrap, {early}))[early]
    assert (record.finish_reason, record.reserved_tokens, record.completion_tokens) == (
        "cancelled",
        100,
        0,
    )
    assert early not in engine.calls
    worker.drain()
    await asyncio.wait_for(task, 30)
