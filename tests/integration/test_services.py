"""The session fixtures start real services that the project's clients can use."""

from __future__ import annotations

import asyncio
import uuid

import aioboto3
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = pytest.mark.integration


async def test_broker_produce_and_consume(kafka_bootstrap: str) -> None:
    topic = f"llmq.test.services.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name=topic, num_partitions=2, replication_factor=1)])
        assert topic in await admin.list_topics()
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            topic, b"hello", key=b"k1", partition=1, headers=[("h", b"v")]
        )
    finally:
        await producer.stop()
    assert meta.partition == 1

    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 1)])
        await consumer.seek_to_beginning(TopicPartition(topic, 1))
        record = await asyncio.wait_for(consumer.getone(), timeout=10)
    finally:
        await consumer.stop()
    assert (record.key, record.value, record.offset) == (b"k1", b"hello", meta.offset)
    assert list(record.headers) == [("h", b"v")]


async def test_valkey_ping_and_pubsub(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        assert await client.ping() is True
        channel = f"llmq:test:{uuid.uuid4().hex[:8]}"
        async with client.pubsub() as pubsub:
            await pubsub.subscribe(channel)
            assert await client.publish(channel, b"token") == 1

            async def next_message() -> dict[str, object]:
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None:
                        return dict(msg)

            message = await asyncio.wait_for(next_message(), timeout=10)
        assert message["channel"] == channel.encode()
        assert message["data"] == b"token"
    finally:
        await client.aclose()


async def test_moto_s3_put_and_get(s3_endpoint: str) -> None:
    session = aioboto3.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    bucket = f"llmq-test-{uuid.uuid4().hex[:8]}"
    async with session.client("s3", endpoint_url=s3_endpoint) as s3:
        await s3.create_bucket(Bucket=bucket)
        await s3.put_object(Bucket=bucket, Key="files/a.jsonl", Body=b'{"x": 1}\n')
        got = await s3.get_object(Bucket=bucket, Key="files/a.jsonl")
        async with got["Body"] as body:
            data = await body.read()
        listed = await s3.list_objects_v2(Bucket=bucket)
    assert data == b'{"x": 1}\n'
    assert [o["Key"] for o in listed["Contents"]] == ["files/a.jsonl"]
