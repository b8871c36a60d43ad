"""Redis adapter: queued prompt tokens per pool and tier (the admission controller's backlog).

The gateway adds a job's prompt tokens when it produces the job; the worker removes them when
it starts (or drops) the job. Removal is clamped at 0 atomically, so a redelivered job removed
twice never drives the counter negative. Every change refreshes an idle TTL, so a counter that
drifted (a job lost between produce and start) resets once the pool has been quiet a while.
"""

from __future__ import annotations

from redis.asyncio import Redis

from topics.catalog import PriorityClass, backlog_key

_REMOVE = """
local left = (tonumber(redis.call('GET', KEYS[1])) or 0) - tonumber(ARGV[1])
if left < 0 then left = 0 end
redis.call('SET', KEYS[1], left, 'PX', ARGV[2])
return left
"""


# KEYS[1]: the counter. ARGV: tokens, limit, ttl in ms. Adds the tokens when the queue is
# empty or stays within the limit; returns {1 if added else 0, the tokens queued before}.
_TRY_ADD = """
local queued = tonumber(redis.call('GET', KEYS[1])) or 0
if queued > 0 and queued + tonumber(ARGV[1]) > tonumber(ARGV[2]) then
  return {0, queued}
end
redis.call('SET', KEYS[1], queued + tonumber(ARGV[1]), 'PX', ARGV[3])
return {1, queued}
"""


class RedisBacklog:
    """Queued prompt tokens as Redis counters (INCRBY on add, clamped DECRBY on remove)."""

    def __init__(self, redis: Redis, idle_ttl_s: int = 600) -> None:
        self._redis = redis
        self._idle_ttl_ms = idle_ttl_s * 1000
        self._remove = redis.register_script(_REMOVE)
        self._try_add = redis.register_script(_TRY_ADD)

    async def add(self, pool: str, tier: PriorityClass, prompt_tokens: int) -> None:
        if prompt_tokens <= 0:
            return
        key = backlog_key(pool, tier)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, prompt_tokens)
            pipe.pexpire(key, self._idle_ttl_ms)
            await pipe.execute()

    async def try_add(
        self, pool: str, tier: PriorityClass, prompt_tokens: int, limit: int
    ) -> tuple[bool, int]:
        """Atomically queue the tokens if the backlog stays within `limit` (or is empty).

        Returns whether they were added and the tokens queued before: concurrent admissions
        on any number of gateways can never together overshoot the limit.
        """
        added, queued = await self._try_add(
            keys=[backlog_key(pool, tier)], args=[prompt_tokens, limit, self._idle_ttl_ms]
        )
        return bool(added), int(queued)

    async def remove(self, pool: str, tier: PriorityClass, prompt_tokens: int) -> None:
        if prompt_tokens <= 0:
            return
        await self._remove(keys=[backlog_key(pool, tier)], args=[prompt_tokens, self._idle_ttl_ms])

    async def queued(self, pool: str, tier: PriorityClass) -> int:
        raw = await self._redis.get(backlog_key(pool, tier))
        return max(int(raw), 0) if raw is not None else 0
