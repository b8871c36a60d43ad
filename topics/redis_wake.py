"""Wake-ups for idle workers over Redis pub/sub (`catalog.wake_channel`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from topics import catalog

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
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(catalog.wake_channel(pool))
                yield None
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        yield None
            except (RedisError, OSError) as exc:
                log.warning("wake_listener_disconnected", error=type(exc).__name__)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(retry_s)
