"""Redis adapter for job runs: one hash per job counting its runs and what they streamed.

Fields: ``starts`` and ``ends`` (runs begun, and runs that ended in a handled way), and
``prompt``/``cached``/``completion`` (the usage the caller has seen so far, written with the
token events that carried it: `topics.redis_reply_batch`). A run that began
but never ended is one whose worker died (SIGKILL, OOM, node loss) or whose engine raised.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from schemas.messages import UsageCounts
from topics.ports import AttemptRecord


class RedisJobAttempts:
    def __init__(self, redis: Redis, ttl_s: int = 86_400) -> None:
        self._redis = redis
        self.ttl_s = ttl_s
        """How long a job's hash lives after its last run began."""

    async def begin(self, key: str) -> AttemptRecord:
        async with self._redis.pipeline(transaction=True) as pipe:
            self.queue_begin(pipe, key)
            starts, fields, _ = await pipe.execute()
        return self.record(starts, fields)

    def queue_begin(self, pipe: Pipeline, key: str) -> None:
        """Queue `begin`'s three commands (count the run, read the hash, renew its TTL) onto
        a pipeline; `record` reads their first two replies."""
        pipe.hincrby(key, "starts", 1)
        pipe.hgetall(key)
        pipe.expire(key, self.ttl_s)

    @staticmethod
    def record(starts: Any, fields: dict[bytes, bytes]) -> AttemptRecord:
        def field(name: str) -> int:
            return int(fields.get(name.encode(), 0))

        return AttemptRecord(
            attempt=int(starts),
            failed=max(int(starts) - 1 - field("ends"), 0),
            delivered=UsageCounts(
                prompt_tokens=field("prompt"),
                cached_tokens=field("cached"),
                completion_tokens=field("completion"),
            ),
        )

    async def ended(self, key: str) -> None:
        await self._redis.hincrby(key, "ends", 1)

    async def runs(self, key: str) -> int:
        """How many runs of the job began (0 if none is remembered)."""
        return int(await self._redis.hget(key, "starts") or 0)
