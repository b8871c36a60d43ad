"""Redis adapter: queued prompt tokens per pool and tier, and per team within them (the
admission controller's backlog).

The gateway adds a job's prompt tokens when it produces the job; the worker removes them when
it starts (or drops) the job. Removal is clamped at 0 atomically, so a redelivered job removed
twice never drives a counter negative. Every change refreshes an idle TTL, so a counter that
drifted (a job lost between produce and start) resets once the pool has been quiet a while.
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis

from topics.catalog import (
    PriorityClass,
    backlog_key,
    slot_freed_key,
    team_backlogs_key,
    team_waiting_key,
)
from topics.ports import BacklogAdmission

NO_TEAM = "-"
"""The team field of callers that name none."""

# KEYS: the pool's counter, the pool's per-team hash, the per-team waiting hash. ARGV:
# tokens, ttl in ms, team, waiting tokens. Each is lowered and clamped at 0; a team at 0
# leaves its hash. (A worker's start script runs the same lines: `REMOVE_LUA`.)
REMOVE_LUA = """
local n = tonumber(ARGV[1])
local left = (tonumber(redis.call('GET', KEYS[1])) or 0) - n
if left < 0 then left = 0 end
redis.call('SET', KEYS[1], left, 'PX', ARGV[2])
local function lower(key, by)
  local mine = (tonumber(redis.call('HGET', key, ARGV[3])) or 0) - by
  if mine > 0 then
    redis.call('HSET', key, ARGV[3], mine)
  else
    redis.call('HDEL', key, ARGV[3])
  end
  if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, ARGV[2]) end
end
lower(KEYS[2], n)
if tonumber(ARGV[4]) > 0 then lower(KEYS[3], tonumber(ARGV[4])) end
"""
_REMOVE = REMOVE_LUA + "return 1\n"

# KEYS: as `REMOVE_LUA`, then the run's slot-freed flag. ARGV: as `REMOVE_LUA` (no waiting
# tokens), then the flag's ttl in ms. Lowers the counters only where the flag was not set.
_FREE_SLOT = (
    "if not redis.call('SET', KEYS[4], 1, 'NX', 'PX', ARGV[5]) then return 0 end\n"
    + REMOVE_LUA
    + "return 1\n"
)

SLOT_FREED_TTL_S = 3600
"""How long a run's slot-freed flag is kept: far longer than any redelivery of that run."""

# KEYS: the pool's counter, the pool's per-team hash, the per-team waiting hash. ARGV:
# tokens, limit, ttl in ms, team, waiting tokens.
# Workers serve teams in weighted fair order, so what is served before this request is the
# team's own queue plus, of each other team's, at most what this team will then have queued
# (equal weights assumed here). The request is queued when that plus itself fits the limit; a
# team with nothing queued is always admitted (so a flooding team cannot lock others out: the
# pool overshoots by at most one request per team). Returns {added, pool tokens before, team
# tokens before, tokens ahead}.
_TRY_ADD = """
local n = tonumber(ARGV[1])
local queued = tonumber(redis.call('GET', KEYS[1])) or 0
local mine = tonumber(redis.call('HGET', KEYS[2], ARGV[4])) or 0
local ahead = mine
local teams = redis.call('HGETALL', KEYS[2])
for i = 1, #teams, 2 do
  if teams[i] ~= ARGV[4] then ahead = ahead + math.min(tonumber(teams[i + 1]) or 0, mine + n) end
end
if mine > 0 and ahead + n > tonumber(ARGV[2]) then return {0, queued, mine, ahead} end
redis.call('SET', KEYS[1], queued + n, 'PX', ARGV[3])
redis.call('HINCRBY', KEYS[2], ARGV[4], n)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], ARGV[4], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {1, queued, mine, ahead}
"""


class RedisBacklog:
    """Queued prompt tokens as Redis counters, per pool and class and per team within them."""

    def __init__(self, redis: Redis, idle_ttl_s: int = 600) -> None:
        self._redis = redis
        self._idle_ttl_ms = idle_ttl_s * 1000
        self._remove = redis.register_script(_REMOVE)
        self._try_add = redis.register_script(_TRY_ADD)
        self._free_slot = redis.register_script(_FREE_SLOT)

    @staticmethod
    def _keys(pool: str, tier: PriorityClass) -> list[str]:
        return [
            backlog_key(pool, tier),
            team_backlogs_key(pool, tier),
            team_waiting_key(pool, tier),
        ]

    async def add(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        if prompt_tokens <= 0:
            return
        pool_key, teams_key, waiting_key = self._keys(pool, tier)
        waiting = prompt_tokens if waiting_tokens is None else waiting_tokens
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(pool_key, prompt_tokens)
            pipe.pexpire(pool_key, self._idle_ttl_ms)
            pipe.hincrby(teams_key, team or NO_TEAM, prompt_tokens)
            pipe.pexpire(teams_key, self._idle_ttl_ms)
            if waiting > 0:
                pipe.hincrby(waiting_key, team or NO_TEAM, waiting)
                pipe.pexpire(waiting_key, self._idle_ttl_ms)
            await pipe.execute()

    async def try_add(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        limit: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> BacklogAdmission:
        """Atomically queue the tokens if what is served before them fits the limit (or the
        team has nothing queued): concurrent admissions on any gateways never overshoot."""
        waiting = prompt_tokens if waiting_tokens is None else waiting_tokens
        result = await self._try_add(
            keys=self._keys(pool, tier),
            args=[prompt_tokens, limit, self._idle_ttl_ms, team or NO_TEAM, waiting],
        )
        added, queued, team_queued, ahead = cast(list[Any], result)
        return BacklogAdmission(bool(added), int(queued), int(team_queued), int(ahead))

    async def remove(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        if prompt_tokens <= 0:
            return
        waiting = prompt_tokens if waiting_tokens is None else waiting_tokens
        await self._remove(
            keys=self._keys(pool, tier),
            args=[prompt_tokens, self._idle_ttl_ms, team or NO_TEAM, waiting],
        )

    async def free_slot(
        self,
        pool: str,
        tier: PriorityClass,
        slot_units: int,
        team: str,
        request_id: str,
        replay_id: str | None = None,
    ) -> bool:
        if slot_units <= 0:
            return False
        freed = await self._free_slot(
            keys=[*self._keys(pool, tier), slot_freed_key(request_id, replay_id)],
            args=[slot_units, self._idle_ttl_ms, team or NO_TEAM, 0, SLOT_FREED_TTL_S * 1000],
        )
        return bool(freed)

    def removal(
        self, pool: str, tier: PriorityClass, prompt_tokens: int, team: str | None = None
    ) -> tuple[list[str], list[int | str]]:
        """KEYS and ARGV of `REMOVE_LUA` for a job that starts (its waiting tokens too), for
        a script that runs those lines among others."""
        args: list[int | str] = [prompt_tokens, self._idle_ttl_ms, team or NO_TEAM, prompt_tokens]
        return self._keys(pool, tier), args

    async def queued(self, pool: str, tier: PriorityClass) -> int:
        raw = await self._redis.get(backlog_key(pool, tier))
        return max(int(raw), 0) if raw is not None else 0

    async def team_queued(self, pool: str, tier: PriorityClass) -> dict[str, int]:
        """Waiting prompt tokens per team: admitted, not started (teams with none are
        absent). Running jobs' slot shares are not in it: a team whose jobs all run waits
        for nothing (they once were, and a steady team always looked as if it queued)."""
        raw = await self._redis.hgetall(team_waiting_key(pool, tier))
        return {k.decode(): int(v) for k, v in cast(dict[bytes, bytes], raw).items()}
