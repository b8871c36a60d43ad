"""Kafka adapters: topic creation, the job producer, the usage producer, job consumers.

Tuned for a low-latency queue and written to run on both Apache Kafka and Tansu (the local
broker): no idempotent producer or transactions (consumers are idempotent by request id
instead), short fetch waits (Tansu does not wake a fetch when data arrives), and topics are
created explicitly (auto-created topics get the wrong partition count).
"""

from __future__ import annotations

from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from schemas.messages import (
    BatchCreatedEvent,
    BatchResultEvent,
    DeadLetter,
    InferenceJob,
    UsageRecord,
)
from topics import catalog
from topics.catalog import PriorityClass
from topics.kafka_connection import client_kwargs, kafka_connection
from topics.ports import JobReceipt

log = structlog.get_logger()

FETCH_MAX_WAIT_MS = 10
"""How long a fetch waits for data; Tansu only answers when this expires, so keep it short."""


async def ensure_topics(bootstrap: str, pools: list[str], partitions: int = 8) -> list[str]:
    """Create every topic the pools need (idempotent); return the ones created now."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in catalog.all_topics(pools) if t not in existing]
        created: list[str] = []
        for topic in missing:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            name=topic,
                            num_partitions=partitions,
                            replication_factor=kafka_connection().replication_factor,
                        )
                    ]
                )
                created.append(topic)
            except TopicAlreadyExistsError:
                pass
        if created:
            log.info("topics_created", topics=created, partitions=partitions)
        return created
    finally:
        await admin.close()


async def topic_partitions(bootstrap: str, client_id: str) -> dict[str, list[int]]:
    """Every topic on the broker and its partition ids. Describes all topics: a metadata
    request naming one topic can auto-create it (Tansu and default Kafka configs do)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id, **client_kwargs())
    await admin.start()
    try:
        described: list[dict[str, Any]] = await admin.describe_topics()
    finally:
        await admin.close()
    return {t["topic"]: sorted(p["partition"] for p in t["partitions"]) for t in described}


class KafkaProducer:
    """One producer per process, shared by every adapter that writes to Kafka."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            **client_kwargs(),
            client_id=client_id,
            acks="all",
            linger_ms=0,
            max_request_size=4 * 1024 * 1024,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> JobReceipt:
        meta = await self._producer.send_and_wait(topic, value=value, key=key, partition=partition)
        return JobReceipt(topic=meta.topic, partition=meta.partition, offset=meta.offset)

    async def partitions_for(self, topic: str) -> list[int]:
        return sorted(await self._producer.partitions_for(topic))


class KafkaJobQueue:
    """Produces `InferenceJob`s to the job topic of their pool and priority class."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer
        self._partitions: dict[str, int] = {}

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        topic = catalog.job_topic(job.pool, job.tier)
        return await self._producer.send(
            topic, job.to_bytes(), key=job.request_id.encode(), partition=partition
        )

    async def partitions(self, pool: str, tier: PriorityClass) -> int:
        topic = catalog.job_topic(pool, tier)
        count = self._partitions.get(topic)
        if count is None:
            count = len(await self._producer.partitions_for(topic))
            self._partitions[topic] = count
        return count


class KafkaUsageSink:
    """Writes one `UsageRecord` per finished request to the usage topic, keyed by team."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer

    async def record(self, usage: UsageRecord) -> None:
        await self._producer.send(catalog.USAGE_TOPIC, usage.to_bytes(), key=usage.team.encode())


class KafkaResultSink:
    """Writes each batch line's `BatchResultEvent` to the durable results topic, keyed by batch."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer

    async def publish(self, event: BatchResultEvent) -> None:
        await self._producer.send(
            catalog.RESULTS_TOPIC, event.to_bytes(), key=event.batch.batch_id.encode()
        )


class KafkaDeadLetterSink:
    """Writes `DeadLetter`s to the dead-letter topic, keyed by request id when known."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer

    async def publish(self, letter: DeadLetter) -> None:
        key = letter.request_id.encode() if letter.request_id else None
        await self._producer.send(catalog.DEAD_TOPIC, letter.to_bytes(), key=key)


class KafkaBatchEvents:
    """Announces created batches on the batch control topic, keyed by batch id."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer

    async def created(self, event: BatchCreatedEvent) -> None:
        await self._producer.send(
            catalog.BATCHES_TOPIC, event.to_bytes(), key=event.batch_id.encode()
        )


def job_consumer(
    bootstrap: str, pool: str, client_id: str, fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
) -> AIOKafkaConsumer:
    """A consumer in the pool's worker group; offsets are committed by hand, never auto."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **client_kwargs(),
        group_id=catalog.worker_group(pool),
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms,
        session_timeout_ms=4000,
        heartbeat_interval_ms=300,
        max_poll_interval_ms=300_000,
    )
