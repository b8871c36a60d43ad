"""Teams sharing a worker on a real broker and Redis: a steady team's burst is not held
behind a flooding team's jobs."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_backlog import RedisBacklog
from topics.redis_relay import RedisReplyRelay

pytestmark = pytest.mark.integration


async def test_a_steady_teams_burst_starts_at_once_beside_a_flooding_team(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    # Six slots, one kept for a team holding none. Team b floods: a standing queue, counted in
    # the admission backlog as the gateway counts it. Team a sends one job at a time, then a
    # burst of 4: more than its weighted share (3 of 6), which a light team may take.
    engine = ScriptedEngine(tokens=40, max_num_seqs=6, step_s=0.025)  # a job runs ~1 s
    queue = KafkaJobQueue(producer)
    redis = Redis.from_url(redis_url)
    backlog = RedisBacklog(redis)

    async def send(request_id: str, team: str) -> None:
        relay.open(request_id)
        job = make_job(pool, relay, request_id, team=team)
        await backlog.add(pool, "interactive", len(job.prompt_token_ids), team)
        await queue.submit(job)

    for i in range(40):
        await send(f"b-{i}", "b")
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, team_usage_window_s=3.0)
    try:
        await asyncio.wait_for(engine.generating.wait(), 30)
        for i in range(4):  # about 4 s of a steady sender: past the first third of its window
            await send(f"a-steady-{i}", "a")
            await collect(relay, f"a-steady-{i}")
        burst = [f"a-burst-{i}" for i in range(4)]
        mark = len(engine.log)
        for rid in burst:
            await send(rid, "a")
        for rid in burst:
            await collect(relay, rid)
    finally:
        worker.drain()
        await asyncio.wait_for(task, 30)
        await redis.aclose()

    # b was held to 2 slots while a was active, so all of a's burst started at once: before
    # any of b's running jobs ended (with b at its plain share, 3, the 4th would wait for one).
    after = engine.log[mark:]
    starts = [i for i, (kind, rid) in enumerate(after) if kind == "start" and rid in burst]
    b_ends = [i for i, (kind, rid) in enumerate(after) if kind == "end" and rid.startswith("b-")]
    assert len(starts) == 4, after
    assert not b_ends or max(starts) < b_ends[0], after
    b_starts = [i for i, (kind, rid) in enumerate(after) if kind == "start" and rid[0] == "b"]
    assert not b_starts or b_starts[0] > max(starts), after  # no b job started before a's
