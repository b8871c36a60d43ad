"""Committing a worker's Kafka offsets: only what `OffsetTracker` says is done, only for the
partitions the worker still owns, and once more before a partition is taken away."""

from __future__ import annotations

from typing import Protocol

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from workers.offsets import OffsetTracker

log = structlog.get_logger()


class Revocable(Protocol):
    """What a rebalance needs of the pull loop."""

    async def commit(self) -> None: ...

    def forget(self, partitions: set[TopicPartition]) -> None: ...

    def announced(self) -> None: ...


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commit what is done, then drop the buffered jobs of partitions being revoked."""

    def __init__(self, loop: Revocable) -> None:
        self._loop = loop

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._loop.commit()
        self._loop.forget(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        names = [f"{tp.topic}:{tp.partition}" for tp in assigned]
        log.info("partitions_assigned", partitions=names)
        self._loop.announced()  # partitions new to it may hold jobs: an idle loop fetches now


async def commit_done(consumer: AIOKafkaConsumer, offsets: OffsetTracker[TopicPartition]) -> None:
    """Commit, per owned partition, up to the lowest job not yet finished. A failure (a
    rebalance in progress) is logged; the next turn commits again."""
    pending = offsets.to_commit()
    if not pending:
        return
    assignment = consumer.assignment()
    owned = {tp: off for tp, off in pending.items() if tp in assignment}
    if not owned:
        return
    try:
        await consumer.commit(owned)
    except Exception as exc:
        log.warning("commit_failed", error=type(exc).__name__)
        return
    offsets.committed(owned)
