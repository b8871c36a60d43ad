"""Quota reconciliation: refund each request's unused reservation from its usage record.

Every gateway runs one consumer in a shared group on the usage topic, so each record is
reconciled once across the fleet; offsets are committed after the refund (a crash between
the two refunds a record twice at worst, which only loosens a quota by one request).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

import structlog
from pydantic import ValidationError

from gateway.services.quota import QuotaService
from schemas.messages import UsageRecord

log = structlog.get_logger()


class UsageStream(Protocol):
    """Usage records in order; `commit()` acknowledges everything yielded so far."""

    def records(self) -> AsyncIterator[bytes]: ...

    async def commit(self) -> None: ...


class UsageReconciler:
    def __init__(self, stream: UsageStream, quota: QuotaService) -> None:
        self._stream = stream
        self._quota = quota
        self._task: asyncio.Task[None] | None = None
        self.reconciled = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-reconciler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async for raw in self._stream.records():
            try:
                usage = UsageRecord.model_validate_json(raw)
            except ValidationError:
                log.warning("usage_record_rejected", size=len(raw))
                continue
            if usage.reserved_tokens:
                await self._quota.reconcile(usage)
            self.reconciled += 1
            await self._stream.commit()
