"""The FastStream subscribers' handler logic on FastStream's in-memory test broker: records
arrive as typed messages, a record that is not one is logged (by size, never content) and
skipped, a failing handler is logged (the rewind and redelivery are shown on the real broker
in tests/integration/test_streams.py)."""

from __future__ import annotations

import dataclasses

from faststream.kafka import TestKafkaBroker
from structlog.testing import capture_logs

from schemas.messages import UsageRecord
from topics.kafka_streams import kafka_broker, subscribe
from topics.streams import USAGE


def usage(request_id: str) -> UsageRecord:
    return UsageRecord(request_id=request_id, team="t", model="m", tier="interactive",
                       prompt_tokens=3, cached_tokens=0, completion_tokens=2,
                       finish_reason="stop", finished_at=1.0)  # fmt: skip


async def test_records_arrive_as_typed_messages_and_bad_ones_are_skipped() -> None:
    broker = kafka_broker("127.0.0.1:9", "test")
    seen: list[UsageRecord] = []

    async def handle(record: UsageRecord) -> None:
        seen.append(record)

    subscribe(broker, USAGE, handle)
    with capture_logs() as logs:
        async with TestKafkaBroker(broker) as test:
            await test.publish(usage("r1").model_dump(mode="json"), USAGE.topic)
            await test.publish(b'{"secret prompt": "do not log me"}', USAGE.topic)
            await test.publish(usage("r2").to_bytes(), USAGE.topic)
    assert [r.request_id for r in seen] == ["r1", "r2"]
    assert seen[0] == usage("r1")
    rejected = [e for e in logs if e["event"] == "record_rejected"]
    assert rejected == [
        {"event": "record_rejected", "topic": USAGE.topic, "size": 34, "log_level": "warning"}
    ]
    assert "secret" not in repr(logs)


async def test_a_failing_handler_is_logged_and_not_acknowledged() -> None:
    broker = kafka_broker("127.0.0.1:9", "test")
    calls = 0

    async def handle(record: UsageRecord) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("redis away")

    stream = dataclasses.replace(USAGE, topic="llmq.test.failing")
    subscribe(broker, stream, handle, retry_s=0)
    with capture_logs() as logs:
        async with TestKafkaBroker(broker) as test:
            await test.publish(usage("r1").to_bytes(), stream.topic)
    assert calls >= 1
    failed = [e for e in logs if e["event"] == "record_handling_failed"]
    assert failed and failed[0]["error"] == "ConnectionError"
