"""Reading a bounded range of one topic, for `llmq replay` (incident recovery).

The reader joins no consumer group: it assigns the partitions itself, seeks, and never commits.
A replay must neither move the workers' committed offsets nor wait seconds for a group join,
and two operators replaying the same topic must not rebalance each other.

It must also terminate. Each partition's end is captured once, before the first record is
handed out, and records produced after that (among them the replay's own output, when it writes
back to the topic it reads) are never read. The end is the partition's *highwater* as reported
by a fetch response, not `end_offsets()`: on Tansu, `end_offsets()` undercounts when the last
batch holds several records (measured: 4 instead of 9), while the highwater is right on both
Tansu and Apache Kafka.

Time ranges (`since`/`until`) scan each partition from its beginning and keep the records whose
own timestamp lies in ``[since, until)``. The broker's lookup by time (ListOffsets with a
timestamp, `offsets_for_times()`) is not used: on Tansu it answers, but wrongly (measured: one
record too early at some batch edges, offset 0 for any time after the last record), and a
replay that silently misses jobs is worse than one that reads a topic end to end (Tansu
consumes about 500k records/s). Record timestamps are the producers' clocks (CreateTime), which
need not increase along a partition, so the scan does not stop early at ``until`` either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import NamedTuple, Self

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from topics.kafka import FETCH_MAX_WAIT_MS, topic_partitions
from topics.kafka_connection import client_kwargs

log = structlog.get_logger()


class TopicRecord(NamedTuple):
    """One record as read: where it lies, when it was produced (ms), its value."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    value: bytes


class Span(NamedTuple):
    """The offsets of one partition to read: ``start`` inclusive, ``end`` exclusive."""

    start: int
    end: int


class UnknownTopicError(LookupError):
    """The topic does not exist on the broker."""


class ReplayReadError(RuntimeError):
    """The range cannot be read (a partition outside the topic, a broker that stopped answering)."""


class KafkaTopicReader:
    """Reads one topic's partitions between captured bounds; `open()` first, then `records()`."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "llmq-replay",
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
        bounds_timeout_s: float = 15.0,
        stall_timeout_s: float = 30.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._bounds_timeout_s = bounds_timeout_s
        self._stall_timeout_s = stall_timeout_s
        # group_id=None: no group, no commits. "earliest" only matters if a log's start moves
        # past a position while reading (retention): read on from the new start.
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            **client_kwargs(),
            client_id=client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=fetch_max_wait_ms,
        )
        self._topic: str | None = None
        self._spans: dict[int, Span] = {}
        self._since_ms: int | None = None
        self._until_ms: int | None = None
        self._partitions_cache: dict[str, list[int]] | None = None

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def partitions(self, topic: str) -> list[int] | None:
        """The topic's partition ids, or None if it does not exist.

        Asks for every topic's metadata (`topic_partitions`), cached for the reader's life.
        """
        if self._partitions_cache is None:
            self._partitions_cache = await topic_partitions(self._bootstrap, self._client_id)
        return self._partitions_cache.get(topic)

    async def open(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        from_offset: int | None = None,
        to_offset: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> dict[int, Span]:
        """Fix what `records()` will read and return it, per partition.

        `from_offset` (inclusive) and `to_offset` (exclusive) apply to every partition, clamped
        to what the partition holds now; `since`/`until` (epoch seconds, ``[since, until)``)
        filter on record timestamps over the whole partition. Partitions default to all.
        """
        known = await self.partitions(topic)
        if known is None:
            raise UnknownTopicError(topic)
        chosen = sorted(set(partitions)) if partitions else known
        missing = [p for p in chosen if p not in known]
        if missing:
            raise ReplayReadError(f"{topic} has partitions {known}; no partition {missing}")
        tps = [TopicPartition(topic, p) for p in chosen]
        self._consumer.assign(tps)
        beginnings: dict[TopicPartition, int] = await self._consumer.beginning_offsets(tps)
        ends = await self._highwaters(tps, beginnings)
        spans: dict[int, Span] = {}
        for tp in tps:
            start = max(beginnings[tp], from_offset or 0)
            end = ends[tp] if to_offset is None else min(ends[tp], to_offset)
            spans[tp.partition] = Span(start, max(start, end))
        self._topic = topic
        self._spans = spans
        # round, not int: 1795960587.482 * 1000 may be 1795960587481.9998
        self._since_ms = None if since is None else round(since * 1000)
        self._until_ms = None if until is None else round(until * 1000)
        log.info(
            "replay_range_opened",
            topic=topic,
            spans={p: list(s) for p, s in spans.items()},
            since_ms=self._since_ms,
            until_ms=self._until_ms,
        )
        return dict(spans)

    async def _highwaters(
        self, tps: list[TopicPartition], beginnings: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Each partition's highwater now, from a fetch at its (always valid) beginning.

        The consumer fetches in the background once a position is set; the first response
        carries the highwater even when it holds no records. Waiting here is polling consumer
        state, which has no event to await.
        """
        for tp in tps:
            self._consumer.seek(tp, beginnings[tp])
        deadline = time.monotonic() + self._bounds_timeout_s
        while True:
            found = {tp: self._consumer.highwater(tp) for tp in tps}
            if all(hw is not None for hw in found.values()):
                return {tp: int(hw) for tp, hw in found.items() if hw is not None}
            if time.monotonic() > deadline:
                waiting = sorted(tp.partition for tp, hw in found.items() if hw is None)
                raise ReplayReadError(
                    f"no fetch answer within {self._bounds_timeout_s}s for partitions {waiting}"
                )
            await asyncio.sleep(0.005)

    async def records(
        self, on_read: Callable[[int], None] | None = None
    ) -> AsyncIterator[TopicRecord]:
        """The records of the opened spans, in offset order per partition, then stop.

        `on_read` is told how many records were read from the broker (time-filtered ones
        included), for a progress bar whose total is the sum of the spans' lengths.
        """
        if self._topic is None:
            raise ReplayReadError("open() a range before reading it")
        topic = self._topic
        active = {
            TopicPartition(topic, p): span
            for p, span in self._spans.items()
            if span.end > span.start
        }
        for tp, opened in active.items():
            self._consumer.seek(tp, opened.start)
        # Empty spans: stop the background prefetch started to learn their highwater.
        self._consumer.pause(*(tp for tp in self._consumer.assignment() if tp not in active))
        idle_since = time.monotonic()
        while active:
            batch = await self._consumer.getmany(*active, timeout_ms=200)
            for tp, found in batch.items():
                span = active.get(tp)
                if span is None:
                    continue
                in_span = [r for r in found if span.start <= r.offset < span.end]
                if in_span:
                    idle_since = time.monotonic()
                if on_read is not None and in_span:
                    on_read(len(in_span))
                for r in in_span:
                    if self._in_window(r.timestamp):
                        yield TopicRecord(
                            topic, tp.partition, r.offset, r.timestamp, r.value or b""
                        )
            for tp in list(active):
                if await self._consumer.position(tp) >= active[tp].end:
                    del active[tp]
                    self._consumer.pause(tp)  # stop prefetching what will not be read
            if active and time.monotonic() - idle_since > self._stall_timeout_s:
                stuck = {tp.partition: list(span) for tp, span in active.items()}
                raise ReplayReadError(
                    f"no records for {self._stall_timeout_s}s before the end of partitions "
                    f"{stuck} (start, end)"
                )

    def _in_window(self, timestamp_ms: int) -> bool:
        if self._since_ms is not None and timestamp_ms < self._since_ms:
            return False
        return self._until_ms is None or timestamp_ms < self._until_ms
