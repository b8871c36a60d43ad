"""Fixtures of the integration tests: a fresh pool's topics, a producer, a reply relay."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from topics.kafka import KafkaProducer, ensure_topics
from topics.redis_relay import RedisReplyRelay


@pytest.fixture
async def pool(kafka_bootstrap: str) -> str:
    name = f"it{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, [name], partitions=2)
    return name


@pytest.fixture
async def producer(kafka_bootstrap: str) -> AsyncIterator[KafkaProducer]:
    p = KafkaProducer(kafka_bootstrap, client_id="test")
    await p.start()
    yield p
    await p.stop()


@pytest.fixture
async def relay(redis_url: str) -> AsyncIterator[RedisReplyRelay]:
    redis = Redis.from_url(redis_url)
    r = RedisReplyRelay(redis, gateway_id=uuid.uuid4().hex[:8])
    await r.start()
    yield r
    await r.stop()
    await redis.aclose()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A client of the session's Valkey, closed after the test."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of the module's own, for tests whose gateways and controllers leave state
    behind in it: their deployments in `llmq.registry` (which every later gateway of the
    session would fold and serve), and a quota consumer group that several gateways joined
    and left (after which Tansu 0.6 never gives a joining member an assignment, so the next
    gateway would wait forever to start)."""
    from llmq import services, starters

    port = services.free_port()
    proc = starters.start_tansu(port, tmp_path_factory.mktemp("own-tansu") / "tansu.log")
    try:
        yield f"{services.LOCALHOST}:{port}"
    finally:
        services.stop(proc)
