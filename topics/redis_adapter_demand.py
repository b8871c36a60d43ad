"""Redis adapter: each LoRA adapter's outstanding jobs in a pool, across gateways.

One sorted set per pool and adapter holds the request ids of its jobs that were produced and
have not ended, scored by their deadlines. Counting prunes entries past their deadline first,
so a job whose end was never recorded (its gateway died) stops counting by itself; no
counter drifts. A gateway adds its job before routing it and removes it when the request ends.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from topics.catalog import adapter_demand_key

# KEYS: the adapter's set. ARGV: now, request id, its deadline, ttl in ms.
_STARTED = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return redis.call('ZCARD', KEYS[1])
"""


class RedisAdapterDemand:
    """Outstanding jobs per pool and adapter (see the module docstring)."""

    def __init__(self, redis: Redis, slack_s: float = 60.0) -> None:
        self._redis = redis
        self._slack_s = slack_s
        """How long after the latest deadline an idle set lingers before Redis drops it."""
        self._started = redis.register_script(_STARTED)

    async def started(self, pool: str, adapter: str, request_id: str, deadline: float) -> int:
        now = time.time()
        ttl_ms = max(1, int((deadline - now + self._slack_s) * 1000))
        key = adapter_demand_key(pool, adapter)
        count = await self._started(keys=[key], args=[now, request_id, deadline, ttl_ms])
        return int(count)

    async def ended(self, pool: str, adapter: str, request_id: str) -> None:
        await self._redis.zrem(adapter_demand_key(pool, adapter), request_id)
