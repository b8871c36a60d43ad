"""The batch state port: what the batch service and the gateway need from the state store.

`batch.redis_store.RedisBatchStore` implements it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from schemas.batches import Batch, BatchErrors, BatchStatus


@dataclass(frozen=True)
class LineRecorded:
    """What `record_line` did, and the batch's counts right after."""

    new: bool
    """False when the line already had a result (a duplicate) or the batch is final."""
    completed: int
    failed: int
    total: int
    status: str

    @property
    def all_accounted(self) -> bool:
        return self.total > 0 and self.completed + self.failed >= self.total


@dataclass(frozen=True)
class StoredBatch:
    """A batch and what only llmq needs to know about it."""

    batch: Batch
    team: str
    cursor: int
    """Lines fanned out so far (the next line to produce)."""
    pool: str | None


class BatchStore(Protocol):
    async def create(self, batch: Batch, team: str) -> None: ...

    async def get(self, batch_id: str) -> StoredBatch | None: ...

    async def list_for_team(
        self, team: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[StoredBatch], bool]: ...

    async def active(self) -> list[str]: ...

    async def transition(
        self, batch_id: str, to: BatchStatus, allowed_from: Iterable[str], *, now: int | None = None
    ) -> bool: ...

    async def update(self, batch_id: str, **fields: str | int) -> None: ...

    async def set_errors(self, batch_id: str, errors: BatchErrors) -> None: ...

    async def advance_cursor(self, batch_id: str, cursor: int) -> None: ...

    async def record_line(
        self, batch_id: str, line: int, ok: bool, payload: bytes
    ) -> LineRecorded: ...

    async def recorded_lines(self, batch_id: str, lines: Sequence[int]) -> list[bytes | None]: ...

    async def try_lock(self, batch_id: str, owner: str, ttl_s: float) -> bool: ...

    async def unlock(self, batch_id: str, owner: str) -> None: ...

    async def mark_cancelled(self, batch_id: str, ttl_s: int) -> None: ...
