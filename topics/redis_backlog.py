"""Redis adapter: queued prompt tokens per pool and tier (the admission controller's backlog).

The gateway adds a job's prompt tokens when it produces the job; the worker removes them when
it starts (or drops) the job. Removal is clamped at 0 atomically, so a redelivered job removed
twice never drives the counter negative. Every change refreshes an idle TTL, so a counter that
drifted (a job lost between produce and start) resets once the pool has been quiet a while.
"""

from __future__ import annotations

from redis.asyncio import Redis

from topics.catalog import PriorityClass, backlog_key, team_backlog_key
from topics.ports import BacklogAdmission

# KEYS: counters to lower. ARGV: tokens, ttl in ms. Each is clamped at 0.
_REMOVE = """
for _, key in ipairs(KEYS) do
  local left = (tonumber(redis.call('GET', key)) or 0) - tonumber(ARGV[1])
  if left < 0 then left = 0 end
  redis.call('SET', key, left, 'PX', ARGV[2])
end
return 1
"""

# KEYS: the pool's counter, the team's counter. ARGV: tokens, pool limit, ttl in ms, team
# limit. Adds to both when the pool's queue stays within its limit and, while other teams
# have work queued, the team's within its share (alone, a team may use the whole pool: the
# share is work-conserving). A team with nothing queued is always admitted (so a flooding
# team cannot lock others out: the pool overshoots by at most one request per team).
# Returns {1 if added else 0, pool tokens before, team tokens before}.
_TRY_ADD = """
local n = tonumber(ARGV[1])
local queued = tonumber(redis.call('GET', KEYS[1])) or 0
local team = tonumber(redis.call('GET', KEYS[2])) or 0
if team > 0 and queued + n > tonumber(ARGV[2]) then return {0, queued, team} end
if team > 0 and queued > team and team + n > tonumber(ARGV[4]) then return {0, queued, team} end
redis.call('SET', KEYS[1], queued + n, 'PX', ARGV[3])
redis.call('SET', KEYS[2], team + n, 'PX', ARGV[3])
return {1, queued, team}
"""


class RedisBacklog:
    """Queued prompt tokens as Redis counters, per pool and class and per team within them."""

    def __init__(self, redis: Redis, idle_ttl_s: int = 600) -> None:
        self._redis = redis
        self._idle_ttl_ms = idle_ttl_s * 1000
        self._remove = redis.register_script(_REMOVE)
        self._try_add = redis.register_script(_TRY_ADD)

    def _keys(self, pool: str, tier: PriorityClass, team: str | None) -> list[str]:
        keys = [backlog_key(pool, tier)]
        if team is not None:
            keys.append(team_backlog_key(pool, tier, team))
        return keys

    async def add(
        self, pool: str, tier: PriorityClass, prompt_tokens: int, team: str | None = None
    ) -> None:
        if prompt_tokens <= 0:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in self._keys(pool, tier, team):
                pipe.incrby(key, prompt_tokens)
                pipe.pexpire(key, self._idle_ttl_ms)
            await pipe.execute()

    async def try_add(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        limit: int,
        team: str | None = None,
        team_limit: int | None = None,
    ) -> BacklogAdmission:
        """Atomically queue the tokens if the backlogs stay within their limits (or are
        empty): concurrent admissions on any number of gateways never overshoot."""
        keys = [backlog_key(pool, tier), team_backlog_key(pool, tier, team or "-")]
        added, queued, team_queued = await self._try_add(
            keys=keys,
            args=[
                prompt_tokens,
                limit,
                self._idle_ttl_ms,
                limit if team_limit is None else team_limit,
            ],
        )
        return BacklogAdmission(bool(added), int(queued), int(team_queued))

    async def remove(
        self, pool: str, tier: PriorityClass, prompt_tokens: int, team: str | None = None
    ) -> None:
        if prompt_tokens <= 0:
            return
        await self._remove(
            keys=self._keys(pool, tier, team), args=[prompt_tokens, self._idle_ttl_ms]
        )

    async def queued(self, pool: str, tier: PriorityClass) -> int:
        raw = await self._redis.get(backlog_key(pool, tier))
        return max(int(raw), 0) if raw is not None else 0
