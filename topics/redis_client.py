"""One way to connect to Redis, for every llmq process: commands ride out a Redis restart.

A Redis restart (a failover, a pod rescheduled) closes every pooled connection. Without
retries the first command on each stale connection fails, and a worker would end a healthy
stream over it. With these settings a command that meets a closed connection reconnects and
is sent again, backing off for up to about 3.5 s in all, which covers a restart.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

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
