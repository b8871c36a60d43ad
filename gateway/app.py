"""The gateway application: wiring of settings, adapters, services and routers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aioboto3
import structlog
from fastapi import FastAPI

from batch.redis_store import RedisBatchStore
from batch.s3_files import S3FileStore
from control.registry import DeploymentRegistry
from gateway.auth import ApiKeyAuthenticator, FailedAuthThrottle
from gateway.errors import install_error_handlers
from gateway.limits import BodyLimitMiddleware, default_max_request_bytes
from gateway.metrics import GatewayMetrics
from gateway.openapi import install_openapi
from gateway.routers import (
    adapters,
    admin,
    batches,
    chat,
    completions,
    deployments,
    files,
    health,
    models,
)
from gateway.s3_adapter_files import S3AdapterFiles
from gateway.services.adapters import AdaptersService
from gateway.services.admin import AdminService
from gateway.services.admission import AdmissionController, TtftPredictor
from gateway.services.arms import ArmRecorder
from gateway.services.batches import BatchesService
from gateway.services.chat import ChatService
from gateway.services.completions import CompletionService
from gateway.services.deployments import DeploymentsService
from gateway.services.files import FilesService
from gateway.services.intake import JobIntake
from gateway.services.offload import ThreadOffload
from gateway.services.quota import QuotaService
from gateway.services.reconcile import UsageReconciler
from gateway.services.registry import ModelRegistry, ReplicaView
from gateway.services.routing import PartitionRouter
from gateway.services.topic_watch import TopicMonitor
from gateway.settings import GatewaySettings
from llmq.heap import freeze_startup_heap
from schemas.chat import ChatCompletion, ChatCompletionRequest
from schemas.completions import Completion, CompletionRequest
from schemas.deployment import Deployment
from schemas.render import ChatRenderer
from topics import catalog
from topics.counted_queue import AnnouncedJobQueue
from topics.kafka import (
    KafkaBatchEvents,
    KafkaJobQueue,
    KafkaProducer,
    ensure_topics,
)
from topics.kafka_connection import configure_kafka
from topics.kafka_registry import KafkaRegistryLog, ensure_registry_topic
from topics.kafka_streams import kafka_broker, subscribe
from topics.kafka_watch import KafkaTopicWatch
from topics.redis_adapter_demand import RedisAdapterDemand
from topics.redis_arm_stats import RedisArmStats
from topics.redis_backlog import RedisBacklog
from topics.redis_client import connect_redis
from topics.redis_relay import RedisCancelBus, RedisReplicaDirectory, RedisReplyRelay
from topics.redis_token_bucket import RedisTokenBucket
from topics.redis_wake import RedisJobWake
from topics.streams import USAGE

log = structlog.get_logger()


def create_app(settings: GatewaySettings) -> FastAPI:
    """Build the gateway; adapters connect in the lifespan, so building is cheap."""
    configure_kafka(settings.kafka_connection)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client_id = f"gateway-{settings.gateway_id}"
        # Requests wait for a free connection instead of failing under a burst.
        redis = connect_redis(settings.redis_url, max_connections=settings.redis_max_connections)
        producer = KafkaProducer(settings.kafka_bootstrap, client_id=client_id)
        # Its own connection, without retries: a cut must surface, so the streams it cut end.
        relay_redis = connect_redis(settings.redis_url, retries=0)
        relay = RedisReplyRelay(relay_redis, settings.gateway_id)
        replicas = ReplicaView(RedisReplicaDirectory(redis), settings.replica_refresh_s)
        offload = ThreadOffload(settings.render_threads, name="llmq-render")
        renderer = ChatRenderer({})

        async def prepare(deployment: Deployment) -> None:
            if not renderer.has(deployment.ref):  # a ref's spec never changes
                await offload.run(renderer.add, deployment)

        async def validate(deployment: Deployment) -> None:
            await offload.run(ChatRenderer.load_tokenizer, deployment.path)
            await ensure_topics(
                settings.kafka_bootstrap, [deployment.pool], settings.job_topic_partitions
            )

        first = settings.deployments[0].name if settings.deployments else None
        registry_log = KafkaRegistryLog(
            settings.kafka_bootstrap, producer, client_id, settings.registry_poll_ms
        )
        deployment_registry = DeploymentRegistry(registry_log)
        registry = ModelRegistry([], replicas, prepare, default=first, adapters=deployment_registry)
        deployment_registry.listen(registry.apply)
        quota = QuotaService(RedisTokenBucket(redis), settings.teams)
        streams = kafka_broker(settings.kafka_bootstrap, client_id)
        subscribe(streams, USAGE, UsageReconciler(quota).handle)
        file_store = S3FileStore(aioboto3.Session(), settings.s3_bucket, settings.s3_endpoint_url)
        await producer.start()
        await ensure_registry_topic(settings.kafka_bootstrap)
        await registry_log.start()
        await deployment_registry.start()
        await deployment_registry.seed(settings.deployments)
        await relay.start()
        await replicas.start()
        await streams.start()
        await file_store.start()
        metrics = GatewayMetrics()
        metrics.watch_replicas(replicas.by_pool)
        metrics.watch_models(lambda: registry.deployments)
        metrics.watch_relay(relay)
        topic_monitor = TopicMonitor(
            KafkaTopicWatch(settings.kafka_bootstrap, f"{client_id}-watch"),
            lambda: (d.pool for d in registry.deployments),
            interval_s=settings.topic_watch_interval_s,
        )
        metrics.watch_topics(lambda: topic_monitor.snapshot)
        watching = (
            asyncio.create_task(topic_monitor.run(), name="topic-watch")
            if settings.topic_watch_interval_s > 0
            else None
        )
        app.state.offload = offload
        intake = JobIntake(
            registry=registry,
            renderer=renderer,
            queue=AnnouncedJobQueue(KafkaJobQueue(producer), RedisJobWake(redis)),
            backlog=RedisBacklog(redis),
            admission=AdmissionController(
                TtftPredictor(
                    overhead_s=settings.admission_overhead_s,
                    fallback_prefill_tokens_per_s=settings.fallback_prefill_tokens_per_s,
                ),
                quantile=settings.admission_quantile,
            ),
            quota=quota,
            router=PartitionRouter(
                prefix_blocks=settings.routing_prefix_blocks,
                block_size=settings.routing_block_size,
                load_factor=settings.routing_load_factor,
                adapter_jobs_per_replica=settings.routing_adapter_jobs_per_replica,
            )
            if settings.routing == "affinity"
            else None,
            request_timeout_s=settings.request_timeout_s,
            produce_timeout_s=settings.produce_timeout_s,
            offload=offload.run,
            demand=RedisAdapterDemand(redis),
        )
        app.state.redis = redis
        app.state.producer = producer
        app.state.registry = registry
        app.state.metrics = metrics
        app.state.started_at = time.time()
        default = registry.default
        app.state.probe_topic = (
            catalog.job_topic(default.pool, "interactive") if default else catalog.USAGE_TOPIC
        )
        cancels = RedisCancelBus(redis)
        arms = ArmRecorder(RedisArmStats(redis), registry.served)
        adapters_service = AdaptersService(
            deployment_registry,
            S3AdapterFiles(settings.s3_endpoint_url),
            app.state.authenticator.knows_team,
            uri_prefix=settings.adapter_uri_prefix,
        )
        app.state.adapters_service = adapters_service
        failed = adapters_service.mark_failed_ref
        app.state.chat_service = ChatService(intake, relay, cancels, metrics, arms, failed)
        app.state.completion_service = CompletionService(
            intake, relay, cancels, metrics, arms, failed
        )
        app.state.deployments_service = DeploymentsService(deployment_registry, registry, validate)
        app.state.admin_service = AdminService(
            lambda: deployment_registry.records,
            replicas.by_pool,
            RedisBacklog(redis),
            metrics.recent,
            settings.gateway_id,
            batches=RedisBatchStore(redis),
            topics=lambda: topic_monitor.snapshot,
        )
        app.state.files_service = FilesService(file_store, settings.files_max_bytes)
        app.state.batches_service = BatchesService(
            RedisBatchStore(redis),
            file_store,
            KafkaBatchEvents(producer),
            settings.batch_completion_window_s,
        )
        freeze_startup_heap()  # else a full GC pass stalls every stream for ~0.25 s
        log.info("gateway_started", gateway_id=settings.gateway_id, port=settings.port)
        try:
            yield
        finally:
            if watching is not None:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
            offload.close()
            await file_store.stop()
            await streams.stop()
            await replicas.stop()
            await relay.stop()
            await deployment_registry.stop()
            await registry_log.stop()
            await producer.stop()
            await redis.aclose()
            await relay_redis.aclose()
            log.info("gateway_stopped", gateway_id=settings.gateway_id)

    app = FastAPI(title="llmq", version="0.1.0", lifespan=lifespan)
    max_bytes = settings.max_request_bytes or default_max_request_bytes(
        d.max_model_len for d in settings.deployments
    )
    app.state.max_request_bytes = max_bytes
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=max_bytes, body_timeout_s=settings.body_timeout_s
    )
    app.state.authenticator = ApiKeyAuthenticator(
        settings.api_keys,
        settings.teams,
        throttle=FailedAuthThrottle(settings.auth_failures_allowed, settings.auth_failure_window_s),
    )
    app.state.authenticator.allow_admins(settings.admin_keys, settings.admin_key_sha256)
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(deployments.router)
    app.include_router(adapters.router)
    app.include_router(admin.router)
    app.include_router(health.router)
    install_openapi(app, [ChatCompletionRequest, ChatCompletion, CompletionRequest, Completion])
    return app
