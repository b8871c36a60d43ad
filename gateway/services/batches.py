"""The Batch API's logic: create (checks, then hand over to the batch service), read, list,
cancel. Validation of the lines, fan-out and collection happen in the batch service (`batch/`).
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol

import structlog

from batch.ports import FileStore
from batch.state_port import BatchStore, StoredBatch
from gateway.errors import ApiError
from schemas.batches import BATCH_ENDPOINTS, Batch, BatchCreateRequest, BatchList
from schemas.messages import BatchCreatedEvent

log = structlog.get_logger()

COMPLETION_WINDOW = "24h"
"""The one completion window OpenAI's Batch API accepts."""
MAX_METADATA_PAIRS = 16


class BatchEvents(Protocol):
    async def created(self, event: BatchCreatedEvent) -> None: ...


def batch_not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No batch found with id '{batch_id}'.", code="batch_not_found")


class BatchesService:
    def __init__(
        self, store: BatchStore, files: FileStore, events: BatchEvents, window_s: int
    ) -> None:
        self._store = store
        self._files = files
        self._events = events
        self._window_s = window_s

    async def create(self, team: str, request: BatchCreateRequest) -> Batch:
        if request.endpoint not in BATCH_ENDPOINTS:
            served = "`, `".join(BATCH_ENDPOINTS)
            raise ApiError(400, f"llmq batches serve `{served}`.", param="endpoint")
        if request.completion_window != COMPLETION_WINDOW:
            raise ApiError(400, "`completion_window` must be `24h`.", param="completion_window")
        _check_metadata(request.metadata)
        stored = await self._files.get(request.input_file_id)
        if stored is None or stored.team != team:
            raise ApiError(
                404,
                f"No such File object: {request.input_file_id}",
                param="input_file_id",
                code="file_not_found",
            )
        if stored.purpose != "batch":
            raise ApiError(
                400,
                "The input file must be uploaded with purpose `batch`.",
                param="input_file_id",
            )
        now = int(time.time())
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex}",
            endpoint=request.endpoint,
            input_file_id=request.input_file_id,
            completion_window=request.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + self._window_s,
            metadata=request.metadata,
        )
        await self._store.create(batch, team)
        try:
            await self._events.created(BatchCreatedEvent(batch_id=batch.id, team=team))
        except Exception as exc:
            await self._store.transition(batch.id, "failed", ("validating",))
            log.warning("batch_announce_failed", batch_id=batch.id, error=type(exc).__name__)
            raise ApiError(
                503,
                "The batch queue is unavailable; retry shortly.",
                type_="server_error",
                code="queue_unavailable",
            ) from exc
        log.info("batch_created", batch_id=batch.id, team=team, input_bytes=stored.bytes)
        return batch

    async def retrieve(self, team: str, batch_id: str) -> Batch:
        return (await self._owned(team, batch_id)).batch

    async def list(self, team: str, after: str | None, limit: int) -> BatchList:
        if not 1 <= limit <= 100:
            raise ApiError(400, "`limit` must be between 1 and 100.", param="limit")
        page, has_more = await self._store.list_for_team(team, after=after, limit=limit)
        data = [stored.batch for stored in page]
        return BatchList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=has_more,
        )

    async def cancel(self, team: str, batch_id: str) -> Batch:
        """Queued lines are dropped (reported as cancelled), running ones finish."""
        current = await self._owned(team, batch_id)
        status = current.batch.status
        if status in ("cancelling", "cancelled"):
            return current.batch
        if not await self._store.transition(batch_id, "cancelling", ("validating", "in_progress")):
            latest = await self._owned(team, batch_id)
            if latest.batch.status in ("cancelling", "cancelled"):
                return latest.batch
            raise ApiError(
                409,
                f"Cannot cancel a batch with status `{latest.batch.status}`.",
                code="batch_not_cancellable",
            )
        expires_at = current.batch.expires_at or int(time.time()) + self._window_s
        await self._store.mark_cancelled(batch_id, expires_at - int(time.time()) + 86_400)
        log.info("batch_cancel_requested", batch_id=batch_id, team=team)
        return (await self._owned(team, batch_id)).batch

    async def _owned(self, team: str, batch_id: str) -> StoredBatch:
        current = await self._store.get(batch_id)
        if current is None or current.team != team:
            raise batch_not_found(batch_id)
        return current


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ApiError(400, "`metadata` holds at most 16 pairs.", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise ApiError(
                400,
                "`metadata` keys are at most 64 characters, values at most 512.",
                param="metadata",
            )
