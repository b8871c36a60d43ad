"""The registry log on Kafka: `llmq.registry`, compacted, one partition, read by every process
from its start (no consumer group: each reader wants all of it) and followed live."""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from pydantic import ValidationError

from schemas.adapters import AdapterRecord
from schemas.registry import DeploymentRecord, registry_record_adapter
from topics import catalog
from topics.kafka import KafkaProducer
from topics.kafka_connection import client_kwargs, kafka_connection
from topics.ports import RegistryEntry

log = structlog.get_logger()

_PARTITION = TopicPartition(catalog.REGISTRY_TOPIC, 0)


async def ensure_registry_topic(bootstrap: str) -> bool:
    """Create the registry topic (compacted, one partition) unless it exists; True if created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs())
    await admin.start()
    try:
        if catalog.REGISTRY_TOPIC in set(await admin.list_topics()):
            return False
        topic = NewTopic(
            name=catalog.REGISTRY_TOPIC,
            num_partitions=1,
            replication_factor=kafka_connection().replication_factor,
            topic_configs={"cleanup.policy": "compact"},
        )
        try:
            await admin.create_topics([topic])
        except TopicAlreadyExistsError:
            return False
        log.info("topics_created", topics=[catalog.REGISTRY_TOPIC], partitions=1)
        return True
    finally:
        await admin.close()


class KafkaRegistryLog:
    """Reads the registry topic from offset 0 with its own group-less consumer; writes through
    the process's shared producer."""

    def __init__(
        self, bootstrap: str, producer: KafkaProducer, client_id: str, poll_ms: int = 250
    ) -> None:
        self._producer = producer
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **client_kwargs(),
            client_id=f"{client_id}-registry",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=poll_ms,
        )
        self._stopped = False

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([_PARTITION])
        await self._consumer.seek_to_beginning(_PARTITION)

    async def stop(self) -> None:
        self._stopped = True
        await self._consumer.stop()

    async def publish(self, name: str, record: DeploymentRecord | AdapterRecord | None) -> int:
        value = record.to_bytes() if record is not None else None
        receipt = await self._producer.send(catalog.REGISTRY_TOPIC, value, key=name.encode())
        return receipt.offset

    async def end_offset(self) -> int:
        ends = await self._consumer.end_offsets([_PARTITION])
        return int(ends[_PARTITION])

    async def entries(self) -> AsyncIterator[RegistryEntry]:
        while not self._stopped:
            batches = await self._consumer.getmany(_PARTITION, timeout_ms=1000)
            for message in batches.get(_PARTITION, []):
                if message.key is None:
                    log.warning("registry_record_skipped", offset=message.offset, reason="no key")
                    continue
                name = message.key.decode()
                record: DeploymentRecord | AdapterRecord | None = None
                if message.value is not None:
                    try:
                        record = registry_record_adapter.validate_json(message.value)
                    except ValidationError as exc:  # a newer schema, or garbage: skip it
                        log.warning(
                            "registry_record_skipped",
                            offset=message.offset,
                            deployment=name,
                            errors=exc.error_count(),
                        )
                        continue
                yield RegistryEntry(message.offset, name, record)
