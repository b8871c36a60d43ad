"""A job leaving the queue in one Redis round trip: the backlog's removal script, the
ledger's and the cancel key's `EXISTS`, and the run count, in one `MULTI`.

The same commands as `RedisBacklog.remove`, `RedisJobLedger.is_finished`,
`RedisJobAttempts.begin` and `RedisCancelBus.is_cancelled` (each adapter queues its own
onto the pipeline), which a worker would otherwise send as four concurrent calls: four
commands' client work and four replies to wait for on the path to a job's first token.
"""

from __future__ import annotations

from redis.asyncio import Redis

from schemas.messages import InferenceJob
from topics import catalog
from topics.ports import StartChecks
from topics.redis_attempts import RedisJobAttempts
from topics.redis_backlog import RedisBacklog


class RedisJobStart:
    def __init__(self, redis: Redis, backlog: RedisBacklog, attempts: RedisJobAttempts) -> None:
        self._redis = redis
        self._backlog = backlog
        self._attempts = attempts

    async def begin(self, job: InferenceJob, attempt_key: str) -> StartChecks:
        async with self._redis.pipeline(transaction=True) as pipe:
            removing = await self._backlog.queue_remove(
                pipe, job.pool, job.tier, len(job.prompt_token_ids), job.team
            )
            pipe.exists(catalog.done_key(job.request_id))
            self._attempts.queue_begin(pipe, attempt_key)
            pipe.exists(catalog.cancel_key(job.request_id))
            replies = await pipe.execute()
        replies = replies[1:] if removing else replies
        finished, starts, fields, _, cancelled = replies
        return StartChecks(
            finished=bool(finished),
            cancelled=bool(cancelled),
            earlier=self._attempts.record(starts, fields),
        )
