"""The worker process: one engine replica pulling its pool's jobs from Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog
from redis.asyncio import Redis

from topics.kafka import KafkaProducer, KafkaUsageSink, job_consumer
from topics.redis_relay import RedisCancelBus, RedisEventPublisher, RedisReplicaDirectory
from workers.engine.port import EngineClient
from workers.heartbeat import Heartbeat
from workers.pull_loop import PullLoop, listen_for_cancels
from workers.runner import JobRunner
from workers.settings import WorkerSettings

log = structlog.get_logger()


def build_engine(settings: WorkerSettings) -> EngineClient:
    from workers.engine.vllm_engine import VllmEngine

    return VllmEngine(
        settings.model_path,
        settings.model,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        dtype=settings.dtype,
    )


async def serve(settings: WorkerSettings, engine: EngineClient) -> None:
    """Load the engine, pull jobs until SIGTERM/SIGINT, then drain and leave cleanly."""
    structlog.contextvars.bind_contextvars(replica=settings.replica_id, pool=settings.pool)
    redis = Redis.from_url(settings.redis_url)
    producer = KafkaProducer(settings.kafka_bootstrap, client_id=settings.replica_id)
    heartbeat = Heartbeat(
        RedisReplicaDirectory(redis, ttl_ms=int(settings.heartbeat_ttl_s * 1000)),
        replica_id=settings.replica_id,
        pool=settings.pool,
        model=settings.model,
        interval_s=settings.heartbeat_interval_s,
    )
    background: list[asyncio.Task[None]] = [asyncio.create_task(heartbeat.run())]
    consumer = job_consumer(settings.kafka_bootstrap, settings.pool, settings.replica_id)
    try:
        await producer.start()
        await engine.start()
        heartbeat.engine = engine
        await consumer.start()
        cancels = RedisCancelBus(redis)
        runner = JobRunner(engine, RedisEventPublisher(redis), KafkaUsageSink(producer), cancels)
        loop = PullLoop(consumer, engine, runner, settings.pool, max_in_flight=engine.max_num_seqs)
        heartbeat.partitions = loop.assigned
        background.append(asyncio.create_task(listen_for_cancels(cancels, loop)))

        def drain() -> None:
            log.info("drain_requested")
            heartbeat.state = "draining"
            loop.stop()

        event_loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            event_loop.add_signal_handler(sig, drain)
        heartbeat.state = "ready"
        log.info("worker_ready", model=settings.model, max_num_seqs=engine.max_num_seqs)
        await loop.run(settings.drain_grace_s)
    finally:
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await heartbeat.remove()
        with contextlib.suppress(Exception):
            await producer.stop()
        await engine.shutdown()
        await redis.aclose()
        log.info("worker_stopped")


def run_worker(settings: WorkerSettings) -> None:
    asyncio.run(serve(settings, build_engine(settings)))
