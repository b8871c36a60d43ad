"""The batch service process: fan-out, result collection and the sweeper, wired to real adapters.

Stateless: every batch's state is in Redis, files are in S3, jobs and results are on Kafka, so
any number of these run side by side and any of them may be killed at any time. Kafka consumer
groups split the work: each created batch is fanned out by one service, each batch's results
(keyed by batch id) are collected by one service.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable

import aioboto3
import structlog
import uvloop
from redis.asyncio import Redis

from batch.collector import ResultCollector
from batch.fanout import BatchFanout
from batch.finalize import BatchFinalizer
from batch.metrics import ActiveBatches, BatchServiceCollector, batch_exposition
from batch.quota import LineQuota
from batch.redis_store import RedisBatchStore
from batch.s3_files import S3FileStore
from batch.settings import BatchSettings
from batch.state_port import BatchStore
from control.registry import DeploymentRegistry
from control.served import ServedModels
from llmq.heap import freeze_startup_heap
from llmq.probes import ProbeServer
from schemas.deployment import Deployment
from schemas.messages import BatchCreatedEvent
from schemas.render import ChatRenderer
from topics.counted_queue import AnnouncedJobQueue
from topics.kafka import KafkaJobQueue, KafkaProducer, ensure_topics
from topics.kafka_connection import configure_kafka
from topics.kafka_registry import KafkaRegistryLog, ensure_registry_topic
from topics.kafka_streams import kafka_broker, subscribe
from topics.redis_backlog import RedisBacklog
from topics.redis_client import connect_redis
from topics.redis_token_bucket import RedisTokenBucket
from topics.redis_wake import RedisJobWake
from topics.streams import BATCH_CONTROL, BATCH_RESULTS

log = structlog.get_logger()


class BatchSweeper:
    """Ends batches nobody else will: expired ones, cancels whose lines never reported back,
    finalizations whose finalizer died, and completions whose trigger was lost."""

    def __init__(
        self, store: BatchStore, finalizer: BatchFinalizer, settings: BatchSettings
    ) -> None:
        self._store = store
        self._finalizer = finalizer
        self._settings = settings
        self.active = ActiveBatches()
        """What the last sweep saw (the batch service's `/metrics` gauges)."""

    async def sweep(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        seen = ActiveBatches()
        for batch_id in await self._store.active():
            try:
                await self._sweep_one(batch_id, now, seen)
            except Exception as exc:  # one broken batch must not stop the others
                log.warning("batch_sweep_failed", batch_id=batch_id, error=type(exc).__name__)
        self.active = seen

    async def _sweep_one(self, batch_id: str, now: float, seen: ActiveBatches) -> None:
        current = await self._store.get(batch_id)
        if current is None:
            return
        seen.add(current.batch)
        batch = current.batch
        counts = batch.request_counts
        done = counts.total > 0 and counts.completed + counts.failed >= counts.total
        if (
            batch.status in ("validating", "in_progress")
            and batch.expires_at
            and (now >= batch.expires_at)
        ):
            filled = await self._finalizer.fill_missing(
                current, "batch_expired", "The batch expired before this request ran."
            )
            log.info("batch_expiring", batch_id=batch_id, expired_lines=filled)
            await self._finalizer.finalize(batch_id, "expired")
        elif batch.status == "cancelling":
            if not done and now - (batch.cancelling_at or now) >= self._settings.cancel_grace_s:
                await self._finalizer.fill_missing(
                    current, "batch_cancelled", "The batch was cancelled before this line ran."
                )
                done = True
            if done:
                await self._finalizer.finalize(batch_id, "cancelled")
        elif batch.status == "in_progress" and done:
            await self._finalizer.finalize(batch_id, "completed")
        elif batch.status == "finalizing" and (
            now - (batch.finalizing_at or now) >= self._settings.finalize_lease_s
        ):
            await self._finalizer.finalize(batch_id, "completed")

    async def run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self._settings.sweep_interval_s)


async def serve(settings: BatchSettings, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set."""
    configure_kafka(settings.kafka_connection)
    client_id = settings.service_id
    pools = sorted({d.pool for d in settings.deployments})
    await ensure_topics(settings.kafka_bootstrap, pools, settings.job_topic_partitions)
    redis = connect_redis(settings.redis_url)
    store = RedisBatchStore(redis)
    files = S3FileStore(aioboto3.Session(), settings.s3_bucket, settings.s3_endpoint_url)
    producer = KafkaProducer(settings.kafka_bootstrap, client_id=client_id)
    # A fan-out still running at shutdown gets this long, then resumes at its cursor elsewhere.
    streams = kafka_broker(settings.kafka_bootstrap, client_id, graceful_timeout_s=10.0)
    finalizer = BatchFinalizer(store, files, client_id, settings.finalize_lease_s)
    renderer = ChatRenderer({})

    async def prepare(deployment: Deployment) -> None:
        if not renderer.has(deployment.ref):  # a ref's spec never changes
            await asyncio.to_thread(renderer.add, deployment)

    models = ServedModels([], prepare)
    await ensure_registry_topic(settings.kafka_bootstrap)
    registry_log = KafkaRegistryLog(
        settings.kafka_bootstrap, producer, client_id, settings.registry_poll_ms
    )
    registry = DeploymentRegistry(registry_log)
    registry.listen(models.apply)
    fanout = BatchFanout(
        store, files, AnnouncedJobQueue(KafkaJobQueue(producer), RedisJobWake(redis)),
        RedisBacklog(redis),
        renderer, models, finalizer,
        max_requests=settings.batch_max_requests, chunk=settings.fanout_chunk,
        quota=LineQuota(RedisTokenBucket(redis), settings.teams), adapters=registry,
    )  # fmt: skip
    collector = ResultCollector(store, finalizer)
    sweeper = BatchSweeper(store, finalizer, settings)

    async def fan_out(event: BatchCreatedEvent) -> None:
        await fanout.handle(event.batch_id)

    subscribe(streams, BATCH_CONTROL, fan_out)
    subscribe(streams, BATCH_RESULTS, collector.handle)
    await files.start()
    await producer.start()
    await registry_log.start()
    await registry.start()
    await registry.seed(settings.deployments)
    await streams.start()
    tasks = [asyncio.create_task(sweeper.run(), name="batch-sweeper")]
    metrics = batch_exposition(
        BatchServiceCollector(store, fanout, collector, lambda: sweeper.active)
    )
    freeze_startup_heap()
    # Probes answer once the service is wholly up (its start-up work, the heap freeze
    # included, is done): a caller that waits for /readyz then finds it settled.
    probes = _probe_server(settings, tasks, redis, streams.ping, metrics)
    if probes is not None:
        await probes.start()
    log.info("batch_service_started", service_id=client_id)
    try:
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        # Stop the subscribers first (a running handler may finish, then they leave their
        # groups: never inside a commit), then cancel what is left (the sweeper).
        await streams.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if probes is not None:
            await probes.stop()
        await collector.drain()
        await registry.stop()
        await registry_log.stop()
        await producer.stop()
        await files.stop()
        await redis.aclose()
        log.info("batch_service_stopped", service_id=client_id)


def _probe_server(
    settings: BatchSettings,
    tasks: list[asyncio.Task[None]],
    redis: Redis,
    kafka_ping: Callable[[float], Awaitable[bool]],
    metrics: Callable[[], bytes],
) -> ProbeServer | None:
    """/healthz: its sweeper is running; /readyz: and Redis (the batch state) and the
    broker (its subscriptions) answer; /metrics: `BatchServiceCollector`."""
    if settings.probe_port is None:
        return None

    async def healthy() -> bool:
        return not any(task.done() for task in tasks)

    async def ready() -> bool:
        async with asyncio.timeout(2):
            return await healthy() and bool(await redis.ping()) and await kafka_ping(2.0)

    return ProbeServer(
        settings.probe_host, settings.probe_port, healthy=healthy, ready=ready, metrics=metrics
    )


def run_batch_service(settings: BatchSettings) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop)

    uvloop.run(main())
