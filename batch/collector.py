"""Result collection: each batch line's result from the results topic, recorded exactly once.

A result is recorded (and counted) before its offset is committed, so a crash re-reads it, and
recording is idempotent per line, so re-reading (or a replay, or a second run of the line)
changes nothing. When the last line of a batch is recorded, the batch is finalized.
"""

from __future__ import annotations

import asyncio

import structlog

from batch.finalize import BatchEnd, BatchFinalizer
from batch.results import result_line, stored
from batch.state_port import BatchStore
from schemas.messages import BatchResultEvent

log = structlog.get_logger()


class ResultCollector:
    """The results topic's handler (`topics.streams.BATCH_RESULTS`)."""

    def __init__(self, store: BatchStore, finalizer: BatchFinalizer) -> None:
        self._store = store
        self._finalizer = finalizer
        self._finalizing: set[asyncio.Task[bool]] = set()
        self.recorded = 0
        self.duplicates = 0

    async def handle(self, event: BatchResultEvent) -> None:
        batch_id = event.batch.batch_id
        ok, line = result_line(event)
        recorded = await self._store.record_line(batch_id, event.batch.line, ok, stored(ok, line))
        if not recorded.new:
            self.duplicates += 1
            log.info("batch_result_duplicate", batch_id=batch_id, request_id=event.request_id)
            return
        self.recorded += 1
        if recorded.all_accounted and recorded.status in ("in_progress", "cancelling"):
            end: BatchEnd = "cancelled" if recorded.status == "cancelling" else "completed"
            task = asyncio.create_task(self._finalizer.finalize(batch_id, end))
            self._finalizing.add(task)
            task.add_done_callback(self._finalizing.discard)

    async def drain(self) -> None:
        """Wait for finalizations started by this collector."""
        if self._finalizing:
            await asyncio.gather(*self._finalizing, return_exceptions=True)
