"""Teams sharing a worker on a real broker and Redis: a steady team's burst is not held
behind a flooding team's jobs."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_backlog import RedisBacklog
from topics.redis_relay import RedisReplyRelay

pytestmark = pytest.mark.integration

STEP_S = 0.025
FLOOD_JOB_S = 4.0
"""How long each of the flooding team's jobs runs."""
STEADY_JOB_S = 0.5
"""How long each of the steady team's jobs runs: a burst job that waited for a slot would
have waited at least that long (for another job to end)."""


async def test_a_steady_teams_burst_starts_at_once_beside_a_flooding_team(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    # Six slots, one kept for a team holding none. Team b floods with long jobs: a standing
    # queue, counted in the admission backlog as the gateway counts it. Team a sends short
    # jobs one at a time, then a burst of 4: more than its weighted share (3 of 6), which a
    # light team may take, as b is held to 2 slots (or 1 while a's jobs wait).
    engine = ScriptedEngine(
        max_num_seqs=6,
        step_s=STEP_S,
        tokens_by_prefix={"b-": int(FLOOD_JOB_S / STEP_S), "a-": int(STEADY_JOB_S / STEP_S)},
    )
    queue = KafkaJobQueue(producer)
    redis = Redis.from_url(redis_url)
    backlog = RedisBacklog(redis)
    sent_at: dict[str, float] = {}

    async def send(request_id: str, team: str) -> None:
        relay.open(request_id)
        job = make_job(pool, relay, request_id, team=team)
        await backlog.add(pool, "interactive", len(job.prompt_token_ids), team)
        sent_at[request_id] = time.monotonic()
        await queue.submit(job)

    for i in range(12):  # as admission keeps a flood's queue short
        await send(f"b-{i}", "b")
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, team_usage_window_s=3.0)
    try:
        await asyncio.wait_for(engine.generating.wait(), 30)
        # A steady sender for longer than b's first jobs run: b's first five end, and b
        # restarts only up to its cap beside a light team.
        steady_until = time.monotonic() + FLOOD_JOB_S + 2.0
        n = 0
        while time.monotonic() < steady_until:
            await send(f"a-steady-{n}", "a")
            await collect(relay, f"a-steady-{n}")
            n += 1
        burst = [f"a-burst-{i}" for i in range(4)]
        for rid in burst:
            await send(rid, "a")
        for rid in burst:
            await collect(relay, rid)
    finally:
        worker.drain()
        await asyncio.wait_for(task, 30)
        await redis.aclose()

    # Every job of the burst started at once: none waited for a slot to free.
    waited = {rid: round(engine.started_at[rid] - sent_at[rid], 3) for rid in burst}
    assert all(seconds < STEADY_JOB_S / 2 for seconds in waited.values()), waited
