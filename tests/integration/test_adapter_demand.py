"""Each LoRA adapter's outstanding jobs on real Valkey: counted across gateways, ended once,
and forgotten at their deadlines when their end is never recorded."""

from __future__ import annotations

import time
import uuid

import pytest
from redis.asyncio import Redis

from topics.catalog import adapter_demand_key
from topics.ports import AdapterDemand
from topics.redis_adapter_demand import RedisAdapterDemand

pytestmark = pytest.mark.integration


@pytest.fixture
def pool() -> str:
    return f"pool{uuid.uuid4().hex[:8]}"


async def test_two_gateways_count_one_adapters_jobs_together(redis: Redis, pool: str) -> None:
    gateway_a: AdapterDemand = RedisAdapterDemand(redis)
    gateway_b: AdapterDemand = RedisAdapterDemand(redis)
    later = time.time() + 60
    assert await gateway_a.started(pool, "t/a", "r1", later) == 1
    assert await gateway_b.started(pool, "t/a", "r2", later) == 2
    assert await gateway_b.started(pool, "t/b", "r3", later) == 1  # another adapter
    assert await gateway_a.started(pool, "t/a", "r1", later) == 2  # a retried start: once
    await gateway_a.ended(pool, "t/a", "r1")
    await gateway_a.ended(pool, "t/a", "r1")  # ended twice: still once
    assert await gateway_b.started(pool, "t/a", "r4", later) == 2  # r2 and r4
    ttl_ms = await redis.pttl(adapter_demand_key(pool, "t/a"))
    assert 60_000 < ttl_ms <= 121_000  # the latest deadline plus the slack


async def test_a_job_whose_end_was_lost_stops_counting_at_its_deadline(
    redis: Redis, pool: str
) -> None:
    demand = RedisAdapterDemand(redis)
    now = time.time()
    await demand.started(pool, "t/a", "lost", now - 1)  # its gateway died; deadline passed
    await demand.started(pool, "t/a", "live", now + 60)
    assert await demand.started(pool, "t/a", "next", now + 60) == 2
    assert await redis.zscore(adapter_demand_key(pool, "t/a"), "lost") is None
