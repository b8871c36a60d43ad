"""Reading a topic from the beginning, as any Kafka client could, until a match appears."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer

T = TypeVar("T")


async def read_until(
    bootstrap: str,
    topic: str,
    parse: Callable[[bytes], T],
    match: Callable[[T], bool],
    within: float = 15.0,
    at_least: int = 1,
) -> list[T]:
    """Every record of `topic` that `match`es, once at least `at_least` have arrived."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        found: list[T] = []
        async with asyncio.timeout(within):
            while len(found) < at_least:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    found.extend(
                        item for item in (parse(r.value or b"") for r in records) if match(item)
                    )
        return found
    finally:
        await consumer.stop()
