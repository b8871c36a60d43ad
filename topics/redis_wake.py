"""Wake-ups for idle workers over Redis pub/sub (`catalog.wake_channel`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from topics import catalog
from topics.redis_client import channel_messages

log = structlog.get_logger()


class RedisJobWake:
    """The `JobWake` of gateways and the batch service, and the workers' listener."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def announce(self, pool: str) -> None:
        """One `PUBLISH`; a Redis failure is logged and swallowed (the job is queued: an idle
        worker finds it at its next idle fetch)."""
        try:
            await self._redis.publish(catalog.wake_channel(pool), b"1")
        except (RedisError, OSError) as exc:
            log.warning("wake_failed", pool=pool, error=type(exc).__name__)

    async def listen(self, pool: str, retry_s: float = 0.5) -> AsyncIterator[None]:
        """Yields once per wake-up of `pool`, and once after each (re)subscription (what was
        announced while it was away is fetched then). Survives Redis restarts."""
        wakes = channel_messages(
            self._redis, catalog.wake_channel(pool), "wake_listener_disconnected", retry_s
        )
        async for _ in wakes:
            yield None
