"""Ending a batch: the output and error files assembled from the recorded lines, then the final
status.

One finalizer at a time holds a batch's lease; a finalizer that dies leaves the batch in
``finalizing`` or ``cancelling`` and the sweeper runs it again once the lease is over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import structlog

from batch.ports import FileStore, iter_lines
from batch.results import error_line, line_id, stored, unpack
from batch.state_port import BatchStore, StoredBatch
from batch.validation import custom_id_of, numbered_requests
from schemas.messages import BatchLineRef

log = structlog.get_logger()

BatchEnd = Literal["completed", "cancelled", "expired"]
READ_CHUNK = 500
"""Recorded lines read from the store at once while assembling files."""


class BatchFinalizer:
    def __init__(self, store: BatchStore, files: FileStore, owner: str, lease_s: float) -> None:
        self._store = store
        self._files = files
        self._owner = owner
        self._lease_s = lease_s

    async def finalize(self, batch_id: str, end: BatchEnd) -> bool:
        """Write the files and move the batch to ``end``; False if another finalizer holds it
        or the batch is not in a status that can end that way."""
        if not await self._store.try_lock(batch_id, self._owner, self._lease_s):
            return False
        try:
            current = await self._store.get(batch_id)
            if current is None:
                return False
            status = current.batch.status
            allowed: tuple[str, ...]
            if end == "completed":
                allowed = ("in_progress", "finalizing")
                if status == "in_progress":
                    await self._store.transition(batch_id, "finalizing", ("in_progress",))
            elif end == "cancelled":
                allowed = ("cancelling",)
            else:
                allowed = ("validating", "in_progress", "finalizing", "cancelling")
            if status not in allowed:
                return False
            output, errors = await self._write_files(current)
            await self._store.update(
                batch_id, output_file_id=output or "", error_file_id=errors or ""
            )
            moved = await self._store.transition(batch_id, end, (*allowed, "finalizing"))
            if moved:
                counts = current.batch.request_counts
                log.info("batch_finalized", batch_id=batch_id, status=end, total=counts.total)
            return moved
        finally:
            await self._store.unlock(batch_id, self._owner)

    async def fill_missing(
        self, current: StoredBatch, code: str, message: str, *, start: int = 0
    ) -> int:
        """Record every line from ``start`` that has no result as failed with ``code``; lines
        that report later are then ignored. Returns how many lines were filled."""
        batch_id = current.batch.id
        filled = 0
        pending: list[tuple[int, str]] = []

        async def flush() -> int:
            found = await self._store.recorded_lines(batch_id, [i for i, _ in pending])
            count = 0
            record: bytes | None
            for (index, custom_id), record in zip(pending, found, strict=True):
                if record is None:
                    ref = BatchLineRef(batch_id=batch_id, line=index, custom_id=custom_id)
                    line = error_line(ref, line_id(batch_id, index), code, message)
                    recorded = await self._store.record_line(
                        batch_id, index, False, stored(False, line)
                    )
                    count += recorded.new
            pending.clear()
            return count

        if current.batch.request_counts.total == 0:
            return 0
        lines = iter_lines(self._files.read(current.batch.input_file_id))
        async for index, _, raw in numbered_requests(lines):
            if index < start:
                continue
            pending.append((index, custom_id_of(raw)))
            if len(pending) >= READ_CHUNK:
                filled += await flush()
        if pending:
            filled += await flush()
        return filled

    async def _write_files(self, current: StoredBatch) -> tuple[str | None, str | None]:
        """(output file id, error file id); a file only when it has lines."""
        counts = current.batch.request_counts
        output = await self._write_file(current, ok=True) if counts.completed else None
        errors = await self._write_file(current, ok=False) if counts.failed else None
        return output, errors

    async def _write_file(self, current: StoredBatch, *, ok: bool) -> str:
        created = await self._files.create(
            team=current.team,
            filename=f"{current.batch.id}_{'output' if ok else 'error'}.jsonl",
            purpose="batch_output",
            chunks=self._lines(current, ok=ok),
            max_bytes=2**62,
        )
        return created.id

    async def _lines(self, current: StoredBatch, *, ok: bool) -> AsyncIterator[bytes]:
        """The recorded lines of one kind, in input order, one JSONL line per chunk."""
        total = current.batch.request_counts.total
        for start in range(0, total, READ_CHUNK):
            indices = list(range(start, min(start + READ_CHUNK, total)))
            records = await self._store.recorded_lines(current.batch.id, indices)
            buffer = bytearray()
            for record in records:
                if record is None:
                    continue
                is_ok, line = unpack(record)
                if is_ok == ok:
                    buffer += line + b"\n"
            if buffer:
                yield bytes(buffer)
