"""What the operator sees of the topics: a consumer group's lag, and the last records of a topic.

Both read without joining a group and never commit: a watcher must not move the workers'
offsets, nor make their group rebalance. Each call uses a short-lived consumer (a metadata
round trip and one fetch per partition), which is cheap at the seconds between refreshes.

A partition's end is its *highwater* as a fetch response reports it, not `end_offsets()`,
which undercounts on Tansu when a batch holds several records (see `topics.kafka_replay`).
The committed offsets come from the group's coordinator (`committed()`; Tansu has no admin
`list_consumer_group_offsets`). Lag counts the records the group has not committed: waiting
jobs plus the ones running (workers commit after a job ends).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from topics.kafka import FETCH_MAX_WAIT_MS, topic_partitions
from topics.kafka_connection import client_kwargs


class KafkaTopicWatch:
    """`lag()` and `tail()` over short-lived consumers (`TopicWatch`)."""

    def __init__(
        self,
        bootstrap: str,
        client_id: str,
        timeout_s: float = 5.0,
        topics_ttl_s: float = 60.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._topics_ttl_s = topics_ttl_s
        self._counts: dict[str, int] = {}
        self._counted_at = -float("inf")

    async def partitions(self, wanted: Sequence[str] = ()) -> dict[str, int]:
        """Every topic on the broker and its partition count. Described once per
        `topics_ttl_s` (a refresh asks for several pools' topics), or again at once when a
        wanted topic is not known yet (a pool registered since)."""
        stale = time.monotonic() - self._counted_at > self._topics_ttl_s
        if stale or any(topic not in self._counts for topic in wanted):
            found = await topic_partitions(self._bootstrap, self._client_id)
            self._counts = {topic: len(ids) for topic, ids in found.items()}
            self._counted_at = time.monotonic()
        return self._counts

    async def lag(self, group: str, topics: Sequence[str]) -> dict[str, int]:
        """Per topic (of those that exist), the records `group` has not committed yet."""
        counts = await self.partitions(topics)
        tps = [TopicPartition(t, p) for t in topics if t in counts for p in range(counts[t])]
        if not tps:
            return {}
        consumer = self._consumer(group)
        await consumer.start()
        try:
            consumer.assign(tps)
            beginnings: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
            starts = {}
            for tp in tps:
                committed = await consumer.committed(tp)
                starts[tp] = beginnings[tp] if committed is None else committed
            ends = await self._highwaters(consumer, starts)
        finally:
            await consumer.stop()
        lag: dict[str, int] = {t: 0 for t in topics if t in counts}
        for tp in tps:
            lag[tp.topic] += max(ends[tp] - starts[tp], 0)
        return lag

    async def tail(self, topic: str, last: int) -> tuple[int, list[bytes]]:
        """(records the topic holds, its last `last` record values over all partitions, by
        timestamp, newest last); (0, []) when it does not exist."""
        count = (await self.partitions([topic])).get(topic)
        if not count:
            return 0, []
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer = self._consumer(None)
        await consumer.start()
        try:
            consumer.assign(tps)
            beginnings: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
            ends = await self._highwaters(consumer, beginnings)
            held = sum(ends[tp] - beginnings[tp] for tp in tps)
            wanted = {tp: max(beginnings[tp], ends[tp] - last) for tp in tps}
            found: list[tuple[int, bytes]] = []
            for tp, start in wanted.items():
                if start < ends[tp]:
                    found += await self._read(consumer, tp, start, ends[tp])
        finally:
            await consumer.stop()
        found.sort(key=lambda item: item[0])
        return held, [value for _, value in found[-last:]] if last > 0 else []

    def _consumer(self, group: str | None) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            **client_kwargs(),
            client_id=self._client_id,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=64 * 1024,  # a highwater needs no records
        )

    async def _highwaters(
        self, consumer: AIOKafkaConsumer, at: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's highwater from a fetch at `at` (a valid position). The fetcher
        runs in the background once positions are set; waiting is polling its state, which
        has no event to await."""
        for tp, offset in at.items():
            consumer.seek(tp, offset)
        deadline = time.monotonic() + self._timeout_s
        while True:
            found = {tp: consumer.highwater(tp) for tp in at}
            if all(hw is not None for hw in found.values()):
                return {tp: int(hw) for tp, hw in found.items() if hw is not None}
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fetch answer within {self._timeout_s}s")
            await asyncio.sleep(0.005)

    async def _read(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int
    ) -> list[tuple[int, bytes]]:
        """(timestamp, value) of the records in [start, end) of one partition."""
        consumer.seek(tp, start)
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self._timeout_s
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=200)
            for record in batch.get(tp, []):
                if start <= record.offset < end:
                    out.append((record.timestamp, record.value or b""))
        return out
