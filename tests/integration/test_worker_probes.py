"""A worker's plain-HTTP probes mean what they say: ready only while it should get work."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from llmq.services import free_port
from schemas.messages import FinishEvent
from tests.integration.queue_helpers import collect, make_job, start_worker
from tests.integration.scripted_engine import ScriptedEngine
from tests.polling import eventually
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_relay import RedisReplyRelay

pytestmark = pytest.mark.integration


async def test_probes_follow_loading_ready_and_draining(
    pool: str, producer: KafkaProducer, relay: RedisReplyRelay, kafka_bootstrap: str, redis_url: str
) -> None:
    port = free_port()
    engine = ScriptedEngine(tokens=40, step_s=0.02)
    worker, task = start_worker(pool, kafka_bootstrap, redis_url, engine, probe_port=port)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

        async def status(path: str) -> int:
            try:
                return (await http.get(path)).status_code
            except httpx.TransportError:
                return 0  # not listening yet

        await eventually(lambda: status("/readyz"), lambda s: s == 200, within=30)
        assert await status("/healthz") == 200
        assert await status("/nope") == 404

        running = f"running-{uuid.uuid4().hex[:6]}"
        relay.open(running)
        await KafkaJobQueue(producer).submit(make_job(pool, relay, running), partition=0)
        await asyncio.wait_for(engine.generating.wait(), 30)
        worker.drain()
        assert await status("/readyz") == 503  # draining: no new work, please
        assert await status("/healthz") == 200  # but alive: do not restart it
        assert isinstance((await collect(relay, running))[-1], FinishEvent)
    await asyncio.wait_for(task, 30)
