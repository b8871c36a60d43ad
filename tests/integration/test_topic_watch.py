"""The topic watcher on the real broker: a pool's lag is what its workers have not committed,
records produced in one batch included (where Tansu's `end_offsets()` undercounts), and the
newest dead letters are found without moving anyone's offsets."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.services.topic_watch import TopicMonitor
from schemas.messages import DeadLetter
from topics import catalog
from topics.kafka import KafkaDeadLetterSink, KafkaProducer
from topics.kafka_watch import KafkaTopicWatch

pytestmark = pytest.mark.integration


async def _commit(bootstrap: str, group: str, tp: TopicPartition, offset: int) -> None:
    """Commit `offset` for `group` as a worker would after its jobs ended."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


async def test_lag_counts_what_the_pools_workers_have_not_committed(
    pool: str, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    interactive = catalog.job_topic(pool, "interactive")
    batch = catalog.job_topic(pool, "batch")
    # Sent together, so the producer packs them into one batch per partition.
    await asyncio.gather(*(producer.send(interactive, b"j", partition=i % 2) for i in range(9)))
    await asyncio.gather(*(producer.send(batch, b"j", partition=0) for _ in range(3)))
    watch = KafkaTopicWatch(kafka_bootstrap, "test-watch")
    group = catalog.worker_group(pool)
    assert await watch.lag(group, [interactive, batch, "no.such.topic"]) == {
        interactive: 9,
        batch: 3,
    }
    await _commit(kafka_bootstrap, group, TopicPartition(interactive, 0), 4)  # 4 of its 5 done
    assert await watch.lag(group, [interactive, batch]) == {interactive: 5, batch: 3}
    # Watching moved nothing: the group's committed offsets are as the "worker" left them.
    assert await watch.lag(group, [interactive, batch]) == {interactive: 5, batch: 3}

    monitor = TopicMonitor(watch, lambda: [pool], interval_s=60)
    snapshot = await monitor.refresh()
    assert snapshot.lag[(pool, "interactive")] == 5 and snapshot.lag[(pool, "batch")] == 3
    assert monitor.snapshot is snapshot


async def test_tail_reads_the_newest_records_of_every_partition(
    pool: str, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    topic = catalog.job_topic(pool, "batch")
    for i in range(6):
        await producer.send(topic, f"r{i}".encode(), partition=i % 2)
    watch = KafkaTopicWatch(kafka_bootstrap, "test-watch")
    held, newest = await watch.tail(topic, 3)
    assert held == 6 and len(newest) == 3
    assert set(newest) <= {f"r{i}".encode() for i in range(6)}
    assert newest[-1] in (b"r5", b"r4")  # the newest (two may share a millisecond)
    assert await watch.tail("no.such.topic", 3) == (0, [])
    held, everything = await watch.tail(topic, 100)
    assert held == 6 and sorted(everything) == [f"r{i}".encode() for i in range(6)]


async def test_the_monitor_shows_the_newest_dead_letters_without_their_payloads(
    pool: str, producer: KafkaProducer, kafka_bootstrap: str
) -> None:
    request_id = f"dead-{uuid.uuid4().hex[:8]}"
    letter = DeadLetter(reason="unparseable", detail="not JSON", request_id=request_id,
                        topic=catalog.job_topic(pool, "interactive"), partition=1, offset=41,
                        payload_b64="c2VjcmV0", failed_at=1.0)  # fmt: skip
    await KafkaDeadLetterSink(producer).publish(letter)
    monitor = TopicMonitor(KafkaTopicWatch(kafka_bootstrap, "test-watch"), lambda: [pool],
                           interval_s=60, dead_letters_shown=10)  # fmt: skip
    snapshot = await monitor.refresh()
    assert snapshot.dead_letters >= 1
    shown = [d for d in snapshot.recent_dead_letters if d.request_id == request_id]
    assert len(shown) == 1 and (shown[0].offset, shown[0].reason) == (41, "unparseable")
    assert "payload" not in shown[0].model_dump_json()
