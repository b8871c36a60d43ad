"""Building blocks of the queue-path integration tests: jobs, workers, event collection."""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.messages import ErrorEvent, FinishEvent, InferenceJob, SamplingSettings, TokenEvent
from tests.integration.scripted_engine import ScriptedEngine
from topics.redis_relay import RedisReplyRelay
from workers.settings import WorkerSettings
from workers.worker import Worker


def make_job(pool: str, relay: RedisReplyRelay, request_id: str, **fields: Any) -> InferenceJob:
    values: dict[str, Any] = dict(
        request_id=request_id,
        team="t",
        model="m",
        pool=pool,
        prompt_token_ids=(1, 2, 3),
        sampling=SamplingSettings(max_tokens=3),
        created_at=0.0,
        deadline=4_000_000_000.0,
        reply_to=relay.channel,
    )
    values.update(fields)
    return InferenceJob(**values)


def start_worker(
    pool: str,
    kafka: str,
    redis: str,
    engine: ScriptedEngine,
    replica: str = "0",
    **settings_fields: Any,
) -> tuple[Worker, asyncio.Task[None]]:
    settings = WorkerSettings(
        kafka_bootstrap=kafka,
        redis_url=redis,
        pool=pool,
        model="m",
        replica_id=f"w-{pool}-{replica}",
        **{"health_probe_interval_s": 0.0, **settings_fields},
    )
    worker = Worker(settings, engine)
    return worker, asyncio.create_task(worker.run())


async def collect(
    relay: RedisReplyRelay, request_id: str
) -> list[TokenEvent | FinishEvent | ErrorEvent]:
    events: list[TokenEvent | FinishEvent | ErrorEvent] = []
    sub = relay._requests[request_id]
    async with asyncio.timeout(30):
        while True:
            event = await sub.next_event()
            events.append(event)
            if not isinstance(event, TokenEvent):
                return events
