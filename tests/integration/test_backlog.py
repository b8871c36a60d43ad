"""Queued prompt tokens per pool and tier on real Valkey: counts, clamping at 0, idle TTL."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from topics.catalog import backlog_key, team_backlogs_key
from topics.ports import QueueBacklog
from topics.redis_backlog import RedisBacklog

pytestmark = pytest.mark.integration


@pytest.fixture
def pool() -> str:
    return f"pool{uuid.uuid4().hex[:8]}"


async def test_add_and_remove_track_queued_tokens_per_tier(redis: Redis, pool: str) -> None:
    backlog: QueueBacklog = RedisBacklog(redis)
    assert await backlog.queued(pool, "interactive") == 0
    await backlog.add(pool, "interactive", 300)
    await backlog.add(pool, "interactive", 200)
    await backlog.add(pool, "batch", 7_000)
    await backlog.remove(pool, "interactive", 300)
    assert await backlog.queued(pool, "interactive") == 200
    assert await backlog.queued(pool, "batch") == 7_000


async def test_backlog_never_goes_below_zero(redis: Redis, pool: str) -> None:
    backlog = RedisBacklog(redis)
    await backlog.remove(pool, "interactive", 50)  # a job started before its add was seen
    assert await backlog.queued(pool, "interactive") == 0
    await backlog.add(pool, "interactive", 100)
    await backlog.remove(pool, "interactive", 100)
    await backlog.remove(pool, "interactive", 100)  # a redelivered job removed twice
    assert await backlog.queued(pool, "interactive") == 0
    assert int(await redis.get(backlog_key(pool, "interactive")) or 0) == 0


async def test_concurrent_updates_are_atomic(redis: Redis, pool: str) -> None:
    backlog = RedisBacklog(redis)
    await asyncio.gather(*(backlog.add(pool, "interactive", 10) for _ in range(50)))
    assert await backlog.queued(pool, "interactive") == 500
    await asyncio.gather(*(backlog.remove(pool, "interactive", 15) for _ in range(50)))
    assert await backlog.queued(pool, "interactive") == 0


async def test_counters_expire_when_the_pool_is_idle(redis: Redis, pool: str) -> None:
    backlog = RedisBacklog(redis, idle_ttl_s=30)
    await backlog.add(pool, "interactive", 10)
    assert 25_000 < await redis.pttl(backlog_key(pool, "interactive")) <= 30_000
    await backlog.remove(pool, "interactive", 5)
    assert 25_000 < await redis.pttl(backlog_key(pool, "interactive")) <= 30_000
    await backlog.add(pool, "interactive", 0)  # no-op
    assert await backlog.queued(pool, "interactive") == 5


async def test_concurrent_admissions_never_overshoot_the_limit(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    backlog = RedisBacklog(redis)
    pool = f"adm-{uuid.uuid4().hex[:6]}"
    try:
        results = await asyncio.gather(
            *(backlog.try_add(pool, "interactive", 100, limit=1_000) for _ in range(50))
        )
        added = [r.queued for r in results if r.added]
        assert len(added) == 10  # the first lands on an empty queue, nine more fit
        assert await backlog.queued(pool, "interactive") == 1_000
        refused = [r.queued for r in results if not r.added]
        assert refused and all(q == 1_000 for q in refused)
    finally:
        await redis.aclose()


async def test_admission_counts_what_fair_queuing_serves_first(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    backlog = RedisBacklog(redis)
    pool = f"share-{uuid.uuid4().hex[:6]}"
    try:
        # Alone, a team may fill the pool's queue (nothing else would be served first) ...
        alone = [
            await backlog.try_add(pool, "interactive", 100, 1_000, team="b") for _ in range(11)
        ]
        assert [r.added for r in alone] == [True] * 10 + [False]
        assert alone[-1].ahead == 1_000
        # ... and another team's requests are admitted beside it: fair queuing serves only
        # as much of b's queue before them as a itself will have queued.
        a = [await backlog.try_add(pool, "interactive", 100, 1_000, team="a") for _ in range(5)]
        assert [r.added for r in a] == [True] * 5
        assert [r.ahead for r in a] == [100, 300, 500, 700, 900]
        sixth = await backlog.try_add(pool, "interactive", 100, 1_000, team="a")
        assert not sixth.added and sixth.ahead == 500 + 600 and sixth.team_queued == 500
        # b is still refused while its queue is full.
        assert not (await backlog.try_add(pool, "interactive", 100, 1_000, team="b")).added
        assert await backlog.team_queued(pool, "interactive") == {"a": 500, "b": 1_000}
        for _ in range(5):
            await backlog.remove(pool, "interactive", 100, team="a")
        assert await backlog.team_queued(pool, "interactive") == {"b": 1_000}
        # A team with nothing queued is admitted even when the pool is over its limit.
        for team in ("c", "d"):
            assert (await backlog.try_add(pool, "interactive", 100, 1_000, team=team)).added
        assert await backlog.queued(pool, "interactive") == 1_200
    finally:
        await redis.aclose()


async def test_a_running_jobs_slot_share_counts_in_the_backlog_but_not_as_waiting(
    redis: Redis, pool: str
) -> None:
    """A job's units are its prompt (waiting until it starts) and its share of slot time
    (until it ends): the team's queue, as the workers read it, holds only the prompt."""
    backlog: QueueBacklog = RedisBacklog(redis)
    admitted = await backlog.try_add(pool, "interactive", 1_500, 10_000, "a", waiting_tokens=500)
    assert admitted.added
    assert await backlog.team_queued(pool, "interactive") == {"a": 500}
    await backlog.remove(pool, "interactive", 500, "a")  # started: its prompt leaves the queue
    assert await backlog.team_queued(pool, "interactive") == {}
    assert await backlog.queued(pool, "interactive") == 1_000  # its slot share, until it ends
    again = await backlog.try_add(pool, "interactive", 1_500, 10_000, "a", waiting_tokens=500)
    assert again.ahead == 1_000  # admission still sees the running job's slot share
    await backlog.remove(pool, "interactive", 1_000, "a", waiting_tokens=0)  # the first ends
    assert await backlog.team_queued(pool, "interactive") == {"a": 500}
    assert await backlog.queued(pool, "interactive") == 1_500


async def test_a_jobs_slot_share_is_freed_once_per_replay(redis: Redis, pool: str) -> None:
    """Whichever of a job's runs and ends reaches it first frees its slot share; the others
    free nothing (a second decrement would uncount another job's share). A replay, queued
    and counted again, frees its own."""
    backlog: QueueBacklog = RedisBacklog(redis)
    await backlog.add(pool, "interactive", 3_000, "a", waiting_tokens=0)  # three running shares
    assert await backlog.free_slot(pool, "interactive", 1_000, "a", "req-1")
    assert not await backlog.free_slot(pool, "interactive", 1_000, "a", "req-1")
    assert await backlog.queued(pool, "interactive") == 2_000
    assert await backlog.free_slot(pool, "interactive", 1_000, "a", "req-1", replay_id="r1")
    assert not await backlog.free_slot(pool, "interactive", 1_000, "a", "req-1", replay_id="r1")
    assert await backlog.queued(pool, "interactive") == 1_000
    assert not await backlog.free_slot(pool, "interactive", 0, "a", "req-2")  # a batch job's
    assert await redis.hgetall(team_backlogs_key(pool, "interactive")) == {b"a": b"1000"}
