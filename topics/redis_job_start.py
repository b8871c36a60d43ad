"""A job leaving the queue in one Redis command: one script that removes its prompt from the
admission backlog, reads whether it finished or was cancelled, and counts its run.

The same effects as `RedisBacklog.remove` (the script runs its `REMOVE_LUA` lines),
`RedisJobLedger.is_finished`, `RedisJobAttempts.begin` and `RedisCancelBus.is_cancelled`,
which a worker would otherwise send as four calls. One `EVALSHA` is one command to pack and
one reply to parse on the path to a job's first token, where a `MULTI` of the same commands
was eight (and redis-py checks a pipeline's scripts with `SCRIPT EXISTS` first, a second
round trip).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from schemas.messages import InferenceJob
from topics import catalog
from topics.ports import StartChecks
from topics.redis_attempts import RedisJobAttempts
from topics.redis_backlog import REMOVE_LUA, RedisBacklog

# KEYS: the backlog's three (`REMOVE_LUA`), the job's done key, its attempt hash, its cancel
# key. ARGV: `REMOVE_LUA`'s four, then the attempt hash's TTL in seconds. Returns {finished,
# starts, the attempt hash as a flat list, cancelled}.
_BEGIN = f"""
if tonumber(ARGV[1]) > 0 then
{REMOVE_LUA}
end
local finished = redis.call('EXISTS', KEYS[4])
local starts = redis.call('HINCRBY', KEYS[5], 'starts', 1)
local fields = redis.call('HGETALL', KEYS[5])
redis.call('EXPIRE', KEYS[5], ARGV[5])
local cancelled = redis.call('EXISTS', KEYS[6])
return {{finished, starts, fields, cancelled}}
"""


class RedisJobStart:
    def __init__(self, redis: Redis, backlog: RedisBacklog, attempts: RedisJobAttempts) -> None:
        self._backlog = backlog
        self._attempts = attempts
        self._begin = redis.register_script(_BEGIN)

    async def begin(self, job: InferenceJob, attempt_key: str) -> StartChecks:
        keys, args = self._backlog.removal(job.pool, job.tier, len(job.prompt_token_ids), job.team)
        keys += [catalog.done_key(job.request_id), attempt_key, catalog.cancel_key(job.request_id)]
        args.append(self._attempts.ttl_s)
        reply: Any = await self._begin(keys=keys, args=args)
        finished, starts, flat, cancelled = reply
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return StartChecks(
            finished=bool(finished),
            cancelled=bool(cancelled),
            earlier=self._attempts.record(starts, fields),
        )
