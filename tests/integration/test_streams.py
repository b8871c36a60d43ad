"""FastStream subscribers on the real broker keep the hand-written loops' guarantees: a
record whose handler fails is rewound and handled again, a record is committed only after its
handler returned (a new member of the group starts after the last one handled), and a record
that is not a message is skipped."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from schemas.messages import UsageRecord
from tests.unit.test_streams import usage
from topics import catalog
from topics.kafka import KafkaProducer
from topics.kafka_streams import kafka_broker, subscribe
from topics.streams import USAGE

pytestmark = pytest.mark.integration


async def test_a_failed_record_is_handled_again_and_only_handled_ones_are_committed(
    pool: str, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    topic = catalog.job_topic(pool, "batch")  # a fresh topic of this test's own
    stream = dataclasses.replace(USAGE, topic=topic, group=f"streams-{uuid.uuid4().hex[:6]}",
                                 from_start=True)  # fmt: skip
    handled: list[str] = []
    failures = {"r2": 1}  # r2's first handling fails (Redis away, say)
    enough = asyncio.Event()
    wanted = 3

    async def handle(record: UsageRecord) -> None:
        if failures.get(record.request_id, 0) > 0:
            failures[record.request_id] -= 1
            raise ConnectionError("away")
        handled.append(record.request_id)
        if len(handled) >= wanted:
            enough.set()

    for rid in ("r1", "r2", "r3"):
        await producer.send(topic, usage(rid).to_bytes(), partition=0)
    await producer.send(topic, b"not a usage record", partition=0)
    first = kafka_broker(kafka_bootstrap, "test")
    subscribe(first, stream, handle, retry_s=0.05)
    await first.start()
    try:
        await asyncio.wait_for(enough.wait(), 30)
    finally:
        await asyncio.wait_for(first.stop(), 30)
    assert handled == ["r1", "r2", "r3"] and failures == {"r2": 0}

    # The next member of the group starts after what was handled (and the skipped record).
    await producer.send(topic, usage("r4").to_bytes(), partition=0)
    enough.clear()
    wanted = 4
    second = kafka_broker(kafka_bootstrap, "test")
    subscribe(second, stream, handle)
    await second.start()
    try:
        await asyncio.wait_for(enough.wait(), 30)
    finally:
        await asyncio.wait_for(second.stop(), 30)
    assert handled == ["r1", "r2", "r3", "r4"]
