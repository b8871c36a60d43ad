"""Heartbeats on a real Valkey: found through their index however many other keys Redis
holds, gone when they expire or their replica leaves."""

from __future__ import annotations

import time
import uuid

import pytest
from redis.asyncio import Redis

from schemas.heartbeat import ReplicaHeartbeat
from tests.polling import eventually
from topics import catalog
from topics.redis_relay import RedisReplicaDirectory

pytestmark = pytest.mark.integration


def _beat(replica_id: str) -> ReplicaHeartbeat:
    return ReplicaHeartbeat(
        replica_id=replica_id, pool="p", model="m", state="ready", sent_at=time.time()
    )


async def test_live_replicas_are_listed_and_expired_or_removed_ones_are_not(
    redis: Redis,
) -> None:
    run = uuid.uuid4().hex[:8]
    steady, brief, leaving = f"{run}-steady", f"{run}-brief", f"{run}-leaving"
    directory = RedisReplicaDirectory(redis, ttl_ms=60_000)
    await directory.beat(_beat(steady))
    await directory.beat(_beat(leaving))
    await RedisReplicaDirectory(redis, ttl_ms=100).beat(_beat(brief))
    # An id whose heartbeat expired long ago (a replica that died without leaving).
    await redis.zadd(catalog.REPLICA_INDEX_KEY, {f"{run}-ancient": 1})
    await directory.remove(leaving)

    async def mine() -> set[str]:
        return {r.replica_id for r in await directory.replicas() if r.replica_id.startswith(run)}

    assert await eventually(mine, lambda ids: ids == {steady}, within=10) == {steady}
    assert await redis.zscore(catalog.REPLICA_INDEX_KEY, f"{run}-ancient") is None  # pruned
    assert await redis.zscore(catalog.REPLICA_INDEX_KEY, leaving) is None
    await directory.remove(steady)
