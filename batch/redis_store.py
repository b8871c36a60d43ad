"""Batch state in Redis: status and timestamps, live counts, the fan-out cursor, recorded lines.

Every change that others race with is one Lua script, so it is atomic across any number of
gateways and batch services:

- `transition` moves a batch between statuses only from the statuses it names (compare and set),
  stamping ``<status>_at``;
- `record_line` stores a line's result only if that line has none yet (``HSETNX``) and only then
  bumps ``completed`` or ``failed``: a redelivered or replayed result is never counted twice.

Redis is the system of record here, so it must be durable: the local stack runs Valkey with an
append-only file, production uses a replicated Redis with AOF (e.g. ElastiCache/MemoryDB). The
results topic stays the source to rebuild from: results are committed there only after they are
recorded here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

from redis.asyncio import Redis

from batch.state_port import LineRecorded, StoredBatch
from schemas.batches import FINAL_STATUSES, Batch, BatchErrors, BatchRequestCounts, BatchStatus
from topics import catalog

KEEP_FINISHED_S = 30 * 86_400
"""How long a finished batch stays retrievable."""
KEEP_LINES_AFTER_FINAL_S = 86_400
"""How long a finished batch's line records stay (late duplicates are then still ignored)."""

_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {0, ''} end
local allowed = false
for i = 4, #ARGV do if ARGV[i] == status then allowed = true end end
if not allowed then return {0, status} end
redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
if ARGV[3] == '1' then
  redis.call('SREM', KEYS[2], redis.call('HGET', KEYS[1], 'id'))
end
return {1, status}
"""

_RECORD_LINE = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {0, 0, 0, 0, ''} end
local final = {failed=1, completed=1, expired=1, cancelled=1}
local new = 0
if not final[status] and redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  new = 1
end
local counts = redis.call('HMGET', KEYS[1], 'completed', 'failed', 'total')
return {new, tonumber(counts[1]) or 0, tonumber(counts[2]) or 0, tonumber(counts[3]) or 0,
        status}
"""


_Value = bytes | bytearray | memoryview | str | int | float
"""What redis-py accepts as a hash field or value."""

_STATIC = ("id", "endpoint", "input_file_id", "completion_window", "created_at", "expires_at")


class RedisBatchStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._transition = redis.register_script(_TRANSITION)
        self._record = redis.register_script(_RECORD_LINE)
        self.lines_recorded = {"completed": 0, "failed": 0}
        """Line results this process recorded first (duplicates and late ones not counted)."""

    async def create(self, batch: Batch, team: str) -> None:
        fields: dict[_Value, _Value] = {
            "team": team,
            "status": batch.status,
            "metadata": json.dumps(batch.metadata or {}),
            "completed": 0,
            "failed": 0,
            "total": 0,
            "cursor": 0,
        }
        for name in _STATIC:
            value = getattr(batch, name)
            if value is not None:
                fields[name] = value
        fields[f"{batch.status}_at"] = batch.created_at
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(catalog.batch_key(batch.id), mapping=fields)
            pipe.zadd(catalog.team_batches_key(team), {batch.id: batch.created_at})
            pipe.sadd(catalog.ACTIVE_BATCHES_KEY, batch.id)
            await pipe.execute()

    async def get(self, batch_id: str) -> StoredBatch | None:
        raw = await self._redis.hgetall(catalog.batch_key(batch_id))
        if not raw:
            return None
        return _decode(cast(dict[bytes, bytes], raw))

    async def list_for_team(
        self, team: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[list[StoredBatch], bool]:
        """The team's batches, newest first, after the batch ``after`` (a cursor id)."""
        key = catalog.team_batches_key(team)
        start = 0
        if after is not None:
            rank = await self._redis.zrevrank(key, after)
            if rank is None:
                return [], False
            start = int(cast(int, rank)) + 1
        ids = cast(list[bytes], await self._redis.zrevrange(key, start, start + limit))
        page: list[StoredBatch] = []
        for batch_id in ids[:limit]:
            stored = await self.get(batch_id.decode())
            if stored is not None:
                page.append(stored)
        return page, len(ids) > limit

    async def active(self) -> list[str]:
        """Ids of batches not yet in a final status."""
        members = await self._redis.smembers(catalog.ACTIVE_BATCHES_KEY)
        return sorted(m.decode() for m in cast(set[bytes], members))

    async def transition(
        self,
        batch_id: str,
        to: BatchStatus,
        allowed_from: Iterable[str],
        *,
        now: int | None = None,
    ) -> bool:
        """Move to ``to`` if the batch is in one of ``allowed_from``; False otherwise."""
        stamp = int(time.time()) if now is None else now
        final = "1" if to in FINAL_STATUSES else "0"
        result = await self._transition(
            keys=[catalog.batch_key(batch_id), catalog.ACTIVE_BATCHES_KEY],
            args=[to, stamp, final, *allowed_from],
        )
        moved = bool(int(cast(list[Any], result)[0]))
        if moved and to in FINAL_STATUSES:
            await self._redis.expire(catalog.batch_key(batch_id), KEEP_FINISHED_S)
            await self._redis.expire(catalog.batch_lines_key(batch_id), KEEP_LINES_AFTER_FINAL_S)
        return moved

    async def update(self, batch_id: str, **fields: str | int) -> None:
        """Set plain fields (total, model, pool, file ids, errors) of an existing batch."""
        mapping: dict[_Value, _Value] = dict(fields.items())
        await self._redis.hset(catalog.batch_key(batch_id), mapping=mapping)

    async def set_errors(self, batch_id: str, errors: BatchErrors) -> None:
        await self.update(batch_id, errors=errors.model_dump_json())

    async def advance_cursor(self, batch_id: str, cursor: int) -> None:
        await self._redis.hset(catalog.batch_key(batch_id), "cursor", cursor)

    async def record_line(self, batch_id: str, line: int, ok: bool, payload: bytes) -> LineRecorded:
        """Record a line's result once; count it only the first time."""
        result = await self._record(
            keys=[catalog.batch_key(batch_id), catalog.batch_lines_key(batch_id)],
            args=[line, "completed" if ok else "failed", payload],
        )
        new, completed, failed, total, status = cast(list[Any], result)
        if int(new):
            self.lines_recorded["completed" if ok else "failed"] += 1
        return LineRecorded(
            new=bool(int(new)),
            completed=int(completed),
            failed=int(failed),
            total=int(total),
            status=status.decode() if isinstance(status, bytes) else str(status),
        )

    async def recorded_lines(self, batch_id: str, lines: Sequence[int]) -> list[bytes | None]:
        """The recorded result of each given line (None where none is recorded)."""
        if not lines:
            return []
        values = await self._redis.hmget(
            catalog.batch_lines_key(batch_id), [str(line) for line in lines]
        )
        return cast(list[bytes | None], values)

    async def try_lock(self, batch_id: str, owner: str, ttl_s: float) -> bool:
        """Take the batch's finalizer lease (one finalizer at a time across services)."""
        key = f"{catalog.batch_key(batch_id)}:finalizer"
        return bool(await self._redis.set(key, owner, nx=True, px=int(ttl_s * 1000)))

    async def unlock(self, batch_id: str, owner: str) -> None:
        key = f"{catalog.batch_key(batch_id)}:finalizer"
        if await self._redis.get(key) == owner.encode():
            await self._redis.delete(key)

    async def mark_cancelled(self, batch_id: str, ttl_s: int) -> None:
        """Tell workers to drop this batch's queued lines."""
        await self._redis.set(catalog.batch_cancel_key(batch_id), b"1", ex=max(ttl_s, 60))


def _decode(raw: dict[bytes, bytes]) -> StoredBatch:
    data = {k.decode(): v.decode() for k, v in raw.items()}

    def number(name: str) -> int | None:
        value = data.get(name)
        return int(value) if value not in (None, "") else None

    stamps: dict[str, Any] = {
        f"{s}_at": number(f"{s}_at")
        for s in ("in_progress", "finalizing", "completed", "failed", "expired")
    }
    stamps["cancelling_at"] = number("cancelling_at")
    stamps["cancelled_at"] = number("cancelled_at")
    errors = data.get("errors")
    metadata = json.loads(data.get("metadata") or "{}")
    batch = Batch(
        id=data["id"],
        endpoint=data["endpoint"],
        input_file_id=data["input_file_id"],
        completion_window=data["completion_window"],
        status=cast(BatchStatus, data["status"]),
        created_at=int(data["created_at"]),
        expires_at=number("expires_at"),
        output_file_id=data.get("output_file_id") or None,
        error_file_id=data.get("error_file_id") or None,
        errors=BatchErrors.model_validate_json(errors) if errors else None,
        request_counts=BatchRequestCounts(
            completed=number("completed") or 0,
            failed=number("failed") or 0,
            total=number("total") or 0,
        ),
        metadata=metadata or None,
        model=data.get("model") or None,
        **stamps,
    )
    return StoredBatch(
        batch=batch, team=data["team"], cursor=number("cursor") or 0, pool=data.get("pool")
    )
