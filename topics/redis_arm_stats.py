"""Redis adapter of `ArmStats`: each version in rollout keeps a capped list of its latest
finished requests (time, outcome, TTFT, TPOT; never a prompt or an id), which every gateway
appends to and the rollout controller reads."""

from __future__ import annotations

from redis.asyncio import Redis

from schemas.rollout import ArmSample

KEPT = 5000
"""Samples kept per version: enough for a step's judgement at hundreds of requests/s."""
TTL_S = 24 * 3600
"""A version no longer in rollout loses its samples after a quiet day."""


def arm_key(ref: str) -> str:
    return f"llmq:arm:{ref}"


class RedisArmStats:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def record(self, ref: str, sample: ArmSample) -> None:
        key = arm_key(ref)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.lpush(key, sample.model_dump_json(exclude_none=True))
            pipe.ltrim(key, 0, KEPT - 1)
            pipe.expire(key, TTL_S)
            await pipe.execute()

    async def since(self, ref: str, since: float) -> list[ArmSample]:
        # Several gateways append, so the list is only roughly in time order: filter it all.
        samples = [
            ArmSample.model_validate_json(raw)
            for raw in await self._redis.lrange(arm_key(ref), 0, -1)
        ]
        return [s for s in samples if s.at >= since]
