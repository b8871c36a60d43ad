"""Redis adapter for job runs: one hash per job counting its runs and what they streamed.

Fields: ``starts`` and ``ends`` (runs begun, and runs that ended in a handled way), and
``prompt``/``cached``/``completion`` (the usage the caller has seen so far). A run that began
but never ended is one whose worker died (SIGKILL, OOM, node loss) or whose engine raised.
"""

from __future__ import annotations

from redis.asyncio import Redis

from schemas.messages import TokenEvent, UsageCounts
from topics.ports import AttemptRecord

_PUBLISH_AND_RECORD = """
local reached = redis.call('PUBLISH', ARGV[1], ARGV[2])
if reached > 0 then
  redis.call('HSET', KEYS[1], 'prompt', ARGV[3], 'cached', ARGV[4], 'completion', ARGV[5])
end
return reached
"""
"""Publish a token event; only if a gateway received it, record the usage as delivered.
PUBLISH counts the subscribers that got the message (on one Redis; a Redis Cluster counts
only its own node's, so llmq uses a single primary for the relay)."""


class RedisJobAttempts:
    def __init__(self, redis: Redis, ttl_s: int = 86_400) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._publish_and_record = redis.register_script(_PUBLISH_AND_RECORD)

    async def begin(self, key: str) -> AttemptRecord:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "starts", 1)
            pipe.hgetall(key)
            pipe.expire(key, self._ttl_s)
            starts, fields, _ = await pipe.execute()

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

    async def publish_delivered(
        self, key: str, channel: str, event: TokenEvent, usage: UsageCounts
    ) -> bool:
        reached = await self._publish_and_record(
            keys=[key],
            args=[
                channel,
                event.to_bytes(),
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            ],
        )
        return int(reached) > 0

    async def runs(self, key: str) -> int:
        """How many runs of the job began (0 if none is remembered)."""
        return int(await self._redis.hget(key, "starts") or 0)
