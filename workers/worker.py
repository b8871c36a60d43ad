"""One worker: an engine replica, its pull loop, heartbeat and cancel listener, wired up."""

from __future__ import annotations

import asyncio
import contextlib
import os

import structlog

from llmq.affinity import pin_floating_threads
from llmq.heap import freeze_startup_heap
from llmq.probes import ProbeServer
from topics.counted_queue import AnnouncedJobQueue
from topics.kafka import (
    KafkaDeadLetterSink,
    KafkaJobQueue,
    KafkaProducer,
    KafkaResultSink,
    KafkaUsageSink,
    job_consumer,
)
from topics.redis_attempts import RedisJobAttempts
from topics.redis_backlog import RedisBacklog
from topics.redis_client import connect_redis
from topics.redis_job_start import RedisJobStart
from topics.redis_relay import (
    RedisCancelBus,
    RedisEventPublisher,
    RedisJobLedger,
    RedisReplicaDirectory,
)
from topics.redis_wake import RedisJobWake
from workers.cancels import listen_for_cancels, listen_for_wakes
from workers.engine.port import EngineClient
from workers.headroom import HeadroomPolicy
from workers.health import EngineHealth
from workers.heartbeat import Heartbeat
from workers.load import LoadTracker
from workers.metrics import CountedDeadLetterSink, WorkerMetrics
from workers.pull_loop import PullLoop
from workers.runner import JobRunner
from workers.settings import WorkerSettings
from workers.team_activity import TEAM_ACTIVE_S, TeamActivity, watch_team_queues

log = structlog.get_logger()


class WorkerUnhealthy(RuntimeError):
    """The engine failed its health checks: exit non-zero for the supervisor to restart."""


class Worker:
    """`run()` serves until `drain()`; cancelling `run()` instead is a crash (no commit)."""

    def __init__(self, settings: WorkerSettings, engine: EngineClient) -> None:
        self.settings = settings
        self.engine = engine
        self.ready = asyncio.Event()
        self._loop: PullLoop | None = None
        self._drain_requested = False
        self._heartbeat: Heartbeat | None = None

    def drain(self) -> None:
        """Stop fetching, let in-flight jobs finish (up to the grace period), commit, leave."""
        log.info("drain_requested")
        self._drain_requested = True
        if self._heartbeat is not None:
            self._heartbeat.state = "draining"
        if self._loop is not None:
            self._loop.stop()

    def _pin_front_end(self) -> None:
        """Move this process's floating threads (and its engine processes') onto
        `frontend_cores`, leaving the engine's bound compute threads on their cores."""
        cores = self.settings.frontend_cores
        if cores:
            moved = pin_floating_threads(os.getpid(), cores)
            log.info("front_end_pinned", cores=cores, threads=moved)

    @property
    def pull_loop(self) -> PullLoop | None:
        """The pull loop, once the worker is ready."""
        return self._loop

    async def run(self) -> None:
        settings = self.settings
        structlog.contextvars.bind_contextvars(replica=settings.replica_id, pool=settings.pool)
        redis = connect_redis(settings.redis_url)
        listener_redis = connect_redis(settings.redis_url, retries=0)
        producer = KafkaProducer(settings.kafka_bootstrap, client_id=settings.replica_id)
        heartbeat = Heartbeat(
            RedisReplicaDirectory(redis, ttl_ms=int(settings.heartbeat_ttl_s * 1000)),
            replica_id=settings.replica_id,
            pool=settings.pool,
            model=settings.model,
            interval_s=settings.heartbeat_interval_s,
            engine_kind=settings.engine,
        )
        self._heartbeat = heartbeat
        background: list[asyncio.Task[None]] = [asyncio.create_task(heartbeat.run())]
        metrics = WorkerMetrics(heartbeat)
        probes = self._probe_server(heartbeat, metrics)
        if probes is not None:
            await probes.start()
        consumer = job_consumer(
            settings.kafka_bootstrap,
            settings.pool,
            settings.replica_id,
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
        )
        loop: PullLoop | None = None
        try:
            await producer.start()
            await self.engine.start()
            self._pin_front_end()
            heartbeat.engine = self.engine
            await consumer.start()
            freeze_startup_heap()  # vLLM and torch: keep full GC passes off token streams
            cancels = RedisCancelBus(redis)
            load = LoadTracker(tpot_slo_s=settings.tpot_slo_s, on_started=metrics.job_started)
            dead_letters = CountedDeadLetterSink(KafkaDeadLetterSink(producer), metrics)
            backlog = RedisBacklog(redis)
            attempts = RedisJobAttempts(redis)
            teams = TeamActivity(TEAM_ACTIVE_S, usage_window_s=settings.team_usage_window_s)
            runner = JobRunner(
                self.engine,
                RedisEventPublisher(redis),
                KafkaUsageSink(producer),
                cancels,
                RedisJobLedger(redis, ttl_s=settings.done_ttl_s),
                backlog,
                load,
                KafkaResultSink(producer),
                cancels,
                attempts,
                dead_letters,
                max_failed_runs=settings.max_failed_runs,
                start=RedisJobStart(redis, backlog, attempts),
            )
            policy = HeadroomPolicy(
                batch_kv_watermark=settings.batch_kv_watermark,
                batch_max_in_flight=settings.batch_max_in_flight,
                team_slot_reserve=settings.team_slot_reserve,
                light_burst_sigmas=settings.light_burst_sigmas,
            )
            loop = PullLoop(
                consumer,
                self.engine,
                runner,
                settings.pool,
                requeue=AnnouncedJobQueue(KafkaJobQueue(producer), RedisJobWake(redis)),
                dead_letters=dead_letters,
                load=load,
                policy=policy,
                fair_lookahead=settings.fair_lookahead,
                teams=teams,
                idle_fetch_interval_s=settings.idle_fetch_interval_s or None,
                fetch_max_wait_s=settings.fetch_max_wait_ms / 1000,
            )
            self._loop = loop
            heartbeat.partitions = loop.assigned
            heartbeat.load = load
            heartbeat.buffered = loop.buffered_by_team
            heartbeat.startable = loop.startable_by_team
            heartbeat.slot_reserve = policy.slot_reserve
            # Its own connection, without retries: a reconnect must resubscribe knowingly.
            listener = RedisCancelBus(listener_redis)
            background.append(asyncio.create_task(listen_for_cancels(listener, loop)))
            wake = RedisJobWake(listener_redis)
            background.append(asyncio.create_task(listen_for_wakes(wake, settings.pool, loop)))
            background.append(asyncio.create_task(watch_team_queues(backlog, settings.pool, teams)))
            if self._drain_requested:
                loop.stop()
            heartbeat.state = "draining" if self._drain_requested else "ready"
            self.ready.set()
            log.info(
                "worker_ready",
                model=settings.model,
                engine=settings.engine,
                max_num_seqs=self.engine.max_num_seqs,
                tpot_slo_s=settings.tpot_slo_s,
            )
            health = EngineHealth(
                self.engine,
                load,
                replica_id=settings.replica_id,
                model=settings.model,
                pool=settings.pool,
                interval_s=settings.health_probe_interval_s,
                timeout_s=settings.health_probe_timeout_s,
                failures_allowed=settings.health_failures_allowed,
                stall_s=settings.watchdog_stall_s,
            )
            await self._serve_while_healthy(loop, health, heartbeat)
        finally:
            if loop is not None:
                await loop.abandon()  # no-op after a drain; a crash leaves jobs uncommitted
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):
                await consumer.stop()
            if probes is not None:
                await probes.stop()
            if heartbeat.healthy:  # an unhealthy one stays visible as such until its TTL ends
                with contextlib.suppress(Exception):
                    await heartbeat.remove()
            with contextlib.suppress(Exception):
                await producer.stop()
            try:  # a hung engine may not stop either: the process exits regardless
                async with asyncio.timeout(self.settings.drain_grace_s):
                    await self.engine.shutdown()
            except Exception as exc:
                log.warning("engine_shutdown_failed", error=type(exc).__name__)
            await redis.aclose()
            await listener_redis.aclose()
            log.info("worker_stopped")

    def _probe_server(self, heartbeat: Heartbeat, metrics: WorkerMetrics) -> ProbeServer | None:
        """/healthz: the engine passes its checks; /readyz: loaded, healthy, not draining;
        /metrics: `WorkerMetrics`."""
        if self.settings.probe_port is None:
            return None

        async def healthy() -> bool:
            return heartbeat.healthy

        async def ready() -> bool:
            return heartbeat.healthy and heartbeat.state == "ready"

        return ProbeServer(
            self.settings.probe_host,
            self.settings.probe_port,
            healthy=healthy,
            ready=ready,
            metrics=metrics.exposition,
        )

    async def _serve_while_healthy(
        self, loop: PullLoop, health: EngineHealth, heartbeat: Heartbeat
    ) -> None:
        """Run the pull loop until it drains, or until the engine turns out unhealthy: then
        say so in the heartbeat (the gateway stops routing here) and raise, abandoning the
        held jobs uncommitted so the partitions' next owner runs them."""
        serving = asyncio.create_task(loop.run(self.settings.drain_grace_s))
        watching = asyncio.create_task(health.watch())
        try:
            await asyncio.wait({serving, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watching, serving):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if not serving.cancelled():
            serving.result()  # drained (or failed: raise that)
            return
        reason = watching.result()
        heartbeat.healthy = False
        with contextlib.suppress(Exception):
            await heartbeat.beat_now()
        log.error("worker_unhealthy", reason=reason)
        raise WorkerUnhealthy(reason)
