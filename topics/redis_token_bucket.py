"""Redis adapter: per-team token buckets, each decision atomic in one round trip (Lua).

A bucket holds up to ``tokens_per_minute`` tokens (one minute's burst) and refills
continuously at ``tokens_per_minute / 60`` per second, measured with the Redis server's clock
(``TIME`` inside the script), so gateways with skewed clocks agree. A bucket untouched for
``ttl_s`` expires; since that is longer than a full refill, an expired bucket is simply full.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from redis.asyncio import Redis

from topics.catalog import bucket_key
from topics.ports import BucketDecision

# KEYS[1]: the bucket. ARGV: capacity, refill per ms, tokens, mode ("reserve" | "refund"),
# ttl in ms, now in ms ("" = the server's TIME). Returns {status, tokens left as a string}:
# status 1 taken, 0 not enough tokens yet, -1 larger than the capacity (never satisfiable).
_BUCKET = """
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local amount = tonumber(ARGV[3])
local now
if ARGV[6] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[6])
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now
end
if now > ts then
  tokens = tokens + (now - ts) * per_ms
  ts = now
end
if tokens > capacity then tokens = capacity end
local status = 1
if ARGV[4] == 'refund' then
  tokens = math.min(capacity, tokens + amount)
elseif amount > capacity then
  status = -1
elseif amount <= tokens then
  tokens = tokens - amount
else
  status = 0
end
local left = string.format('%.6f', tokens)
redis.call('HSET', KEYS[1], 'tokens', left, 'ts', string.format('%d', ts))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {status, left}
"""

_EPSILON = 1e-9


class RedisTokenBucket:
    """`TokenBucket` on Redis. `clock_ms` replaces the server's TIME (tests only)."""

    def __init__(
        self, redis: Redis, *, ttl_s: int = 120, clock_ms: Callable[[], int] | None = None
    ) -> None:
        if ttl_s < 60:
            raise ValueError("ttl_s must cover a full refill (60 s)")
        self._ttl_ms = ttl_s * 1000
        self._clock_ms = clock_ms
        self._script = redis.register_script(_BUCKET)

    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        """Take `tokens` if the bucket holds them; refuse (taking nothing) otherwise."""
        status, left = await self._run(team, tokens, tokens_per_minute, "reserve")
        remaining = math.floor(left + _EPSILON)
        if status == 1:
            return BucketDecision(allowed=True, remaining=remaining, retry_after_s=0)
        if status == -1:
            return BucketDecision(
                allowed=False, remaining=remaining, retry_after_s=0, outcome="exceeds_capacity"
            )
        per_s = tokens_per_minute / 60
        retry_after = max(1, math.ceil((tokens - left) / per_s - _EPSILON))
        return BucketDecision(
            allowed=False,
            remaining=remaining,
            retry_after_s=retry_after,
            outcome="insufficient_tokens",
        )

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        """Give back `tokens`; the bucket never exceeds its capacity."""
        await self._run(team, tokens, tokens_per_minute, "refund")

    async def tokens(self, team: str, tokens_per_minute: int) -> float:
        """Tokens in the bucket now (refilled; takes nothing)."""
        _, left = await self._run(team, 0, tokens_per_minute, "reserve")
        return left

    async def _run(
        self, team: str, tokens: int, tokens_per_minute: int, mode: str
    ) -> tuple[int, float]:
        if tokens < 0 or tokens_per_minute <= 0:
            raise ValueError("tokens must be >= 0 and tokens_per_minute > 0")
        now = "" if self._clock_ms is None else str(self._clock_ms())
        args: list[str | int] = [
            tokens_per_minute,
            repr(tokens_per_minute / 60_000),
            tokens,
            mode,
            self._ttl_ms,
            now,
        ]
        status, left = await self._script(keys=[bucket_key(team)], args=args)
        if isinstance(left, bytes):
            left = left.decode()
        return int(status), float(left)
