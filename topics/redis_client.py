"""One way to connect to Redis, for every llmq process: commands ride out a Redis restart.

A Redis restart (a failover, a pod rescheduled) closes every pooled connection. Without
retries the first command on each stale connection fails, and a worker would end a healthy
stream over it. With these settings a command that meets a closed connection reconnects and
is sent again, backing off for up to about 3.5 s in all, which covers a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, RedisError, TimeoutError

log = structlog.get_logger()

RETRIES = 6
"""Sends of one command after the first fails: 0.1, 0.2, 0.4, 0.8, 1, 1 s apart."""


def connect_redis(url: str, *, max_connections: int = 100, retries: int = RETRIES) -> Redis:
    """A client for `url`, with at most `max_connections` connections: callers beyond it wait
    (up to 10 s) for a free one instead of failing under a burst (redis-py's own pool has
    the same cap of 100 but raises `MaxConnectionsError` past it: a worker starting 32 jobs
    at once, each with its few concurrent checks, went past it).

    Subscribers take ``retries=0``: a pub/sub connection that reconnected by itself would
    hide the messages published while it was away, so they see the error and handle the gap.
    """
    options = {
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.1), retries),
        # BusyLoadingError: a restarted Redis answers LOADING while it reads its data back.
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError],
    }
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=10, **options
    )
    return Redis(connection_pool=pool)


async def channel_messages(
    redis: Redis, channel: str, disconnected: str, retry_s: float = 0.5
) -> AsyncIterator[bytes | None]:
    """What is published on `channel`, for the life of the caller: None after each
    (re)subscription (what was published while it was away is lost: the caller catches up
    then), then each message's data. Survives Redis restarts by subscribing again, after
    logging `disconnected`. Give it a client with ``retries=0``."""
    while True:
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            yield None
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    yield message["data"]
        except (RedisError, OSError) as exc:
            log.warning(disconnected, error=type(exc).__name__)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
        await asyncio.sleep(retry_s)
