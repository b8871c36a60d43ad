"""The gateway application: wiring of settings, adapters, services and routers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from redis.asyncio import Redis

from gateway.auth import ApiKeyAuthenticator
from gateway.errors import install_error_handlers
from gateway.metrics import GatewayMetrics
from gateway.routers import chat, health, models
from gateway.services.chat import ChatService
from gateway.services.registry import ModelRegistry, ReplicaView
from gateway.services.render import ChatRenderer
from gateway.settings import GatewaySettings
from topics import catalog
from topics.kafka import KafkaJobQueue, KafkaProducer
from topics.redis_relay import RedisCancelBus, RedisReplicaDirectory, RedisReplyRelay

log = structlog.get_logger()


def create_app(settings: GatewaySettings, renderer: ChatRenderer | None = None) -> FastAPI:
    """Build the gateway; adapters connect in the lifespan, so building is cheap."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = Redis.from_url(settings.redis_url)
        producer = KafkaProducer(
            settings.kafka_bootstrap, client_id=f"gateway-{settings.gateway_id}"
        )
        relay = RedisReplyRelay(redis, settings.gateway_id)
        replicas = ReplicaView(RedisReplicaDirectory(redis), settings.replica_refresh_s)
        registry = ModelRegistry(settings.deployments, replicas)
        await producer.start()
        await relay.start()
        await replicas.start()
        metrics = GatewayMetrics()
        app.state.redis = redis
        app.state.producer = producer
        app.state.registry = registry
        app.state.metrics = metrics
        app.state.started_at = time.time()
        default = registry.default
        app.state.probe_topic = (
            catalog.job_topic(default.pool, "interactive") if default else catalog.USAGE_TOPIC
        )
        app.state.chat_service = ChatService(
            registry=registry,
            renderer=renderer or ChatRenderer.load(settings.deployments),
            queue=KafkaJobQueue(producer),
            relay=relay,
            cancels=RedisCancelBus(redis),
            metrics=metrics,
            request_timeout_s=settings.request_timeout_s,
        )
        log.info("gateway_started", gateway_id=settings.gateway_id, port=settings.port)
        try:
            yield
        finally:
            await replicas.stop()
            await relay.stop()
            await producer.stop()
            await redis.aclose()
            log.info("gateway_stopped", gateway_id=settings.gateway_id)

    app = FastAPI(title="llmq", version="0.1.0", lifespan=lifespan)
    app.state.authenticator = ApiKeyAuthenticator(settings.api_keys)
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(models.router)
    app.include_router(health.router)
    return app
