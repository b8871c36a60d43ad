"""The registry: every deployment's latest record, folded from the registry log and followed
live, and the one way to change it (optimistic concurrency on the record's revision).

Every process that serves or routes (gateways, the batch service) holds one. A change is
written to the log and takes effect in each process when that process folds it, including in
the writer, which waits for its own record before it answers: when `update` returns, this
process serves the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

import structlog

from schemas.adapters import AdapterRecord, adapter_key, is_adapter_key
from schemas.deployment import Deployment
from schemas.registry import DeploymentRecord, TrafficSplit, spec_of
from schemas.registry import DeploymentVersion as Version
from topics.ports import RegistryLog

RecordT = TypeVar("RecordT", DeploymentRecord, AdapterRecord)

log = structlog.get_logger()

Listener = Callable[[str, DeploymentRecord | None], Awaitable[None]]
"""Called with each name whose record changed (None: deleted), after it is folded."""
Change = Callable[[DeploymentRecord | None], DeploymentRecord | None]
"""Given a name's current record, the record it should have (the same one: no change)."""
AdapterChange = Callable[[AdapterRecord | None], AdapterRecord | None]
"""Given an adapter's current record, the record it should have (None: delete it)."""


class AdapterCatalog(Protocol):
    """Every team's adapters (`DeploymentRegistry`, folded from the registry log,
    is one)."""

    @property
    def adapters(self) -> list[AdapterRecord]: ...

    def adapter(self, team: str, name: str) -> AdapterRecord | None: ...


class RegistryConflict(RuntimeError):
    """Another writer changed the deployment at the same revision, every time we tried."""


class RegistryUnavailable(RuntimeError):
    """The registry log could not be read up to where it was asked to be."""


class DeploymentRegistry:
    """The fold of the registry log: name -> the highest-revision record seen first; teams'
    adapters likewise under their own keys (`schemas.adapters.adapter_key`)."""

    def __init__(self, registry_log: RegistryLog, *, now: Callable[[], float] = time.time) -> None:
        self._log = registry_log
        self._now = now
        self._records: dict[str, DeploymentRecord] = {}
        self._adapters: dict[str, AdapterRecord] = {}
        self._listeners: list[Listener] = []
        self._folded = -1
        self._advanced = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def listen(self, listener: Listener) -> None:
        """Call `listener` for every change folded from now on (and not for earlier ones)."""
        self._listeners.append(listener)

    @property
    def records(self) -> dict[str, DeploymentRecord]:
        return dict(self._records)

    def get(self, name: str) -> DeploymentRecord | None:
        return self._records.get(name)

    @property
    def adapters(self) -> list[AdapterRecord]:
        """Every team's adapters."""
        return list(self._adapters.values())

    def adapter(self, team: str, name: str) -> AdapterRecord | None:
        """Team `team`'s adapter `name` (None: it has none of that name)."""
        return self._adapters.get(adapter_key(team, name))

    async def start(self, timeout_s: float = 30.0) -> None:
        """Fold the log up to its end as it is now, then follow it in the background."""
        end = await self._log.end_offset()
        self._task = asyncio.create_task(self._follow(), name="registry-follow")
        await self.wait_folded(end - 1, timeout_s)
        log.info("registry_loaded", deployments=len(self._records), offset=end)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_folded(self, offset: int, timeout_s: float = 30.0) -> None:
        """Return once the entry at `offset` (and every one before) has been folded."""
        try:
            async with asyncio.timeout(timeout_s), self._advanced:
                await self._advanced.wait_for(lambda: self._folded >= offset)
        except TimeoutError as exc:
            raise RegistryUnavailable(
                f"the registry log was not read up to offset {offset} in {timeout_s:.0f}s"
            ) from exc

    async def _follow(self) -> None:
        while True:
            try:
                async for entry in self._log.entries():
                    if is_adapter_key(entry.name):
                        changed = False
                        self._fold_adapter(entry.name, entry.record)
                    else:
                        changed = self._fold(entry.name, entry.record)
                    if changed:
                        for listener in self._listeners:
                            try:
                                await listener(entry.name, self._records.get(entry.name))
                            except Exception:
                                log.exception("registry_listener_failed", deployment=entry.name)
                    async with self._advanced:
                        self._folded = entry.offset
                        self._advanced.notify_all()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker away: keep what we have, read on later
                log.warning("registry_follow_failed", error=type(exc).__name__)
                await asyncio.sleep(1.0)

    def _fold_adapter(self, key: str, record: DeploymentRecord | AdapterRecord | None) -> None:
        if record is None:
            self._adapters.pop(key, None)
            return
        current = self._adapters.get(key)
        if not isinstance(record, AdapterRecord) or record.key != key:
            log.warning("registry_record_skipped", key=key, reason="not this key's adapter")
        elif current is None or record.revision > current.revision:
            self._adapters[key] = record
            log.info("registry_folded", adapter=key, revision=record.revision)

    def _fold(self, name: str, record: DeploymentRecord | AdapterRecord | None) -> bool:
        if isinstance(record, AdapterRecord):
            log.warning("registry_record_skipped", key=name, reason="an adapter under a name")
            return False
        current = self._records.get(name)
        if record is None:
            return self._records.pop(name, None) is not None
        if current is not None and record.revision <= current.revision:
            return False  # a writer that lost a race, or an old record before compaction
        self._records[name] = record
        log.info("registry_folded", deployment=name, revision=record.revision)
        return True

    async def update(self, name: str, change: Change, attempts: int = 3) -> DeploymentRecord:
        """Apply `change` to the current record of `name` and write the result; retried on a
        conflicting write. `change` may raise to refuse (nothing is written)."""
        for _ in range(attempts):
            current = self._records.get(name)
            wanted = change(current)
            if wanted is None or wanted == current:
                if current is None:
                    raise KeyError(name)
                return current
            record = self._stamped(wanted, current)
            if (won := await self._write(name, record, self._records)) is not None:
                log.info("registry_written", deployment=name, revision=record.revision)
                return won
            log.info("registry_write_lost", deployment=name, revision=record.revision)
        raise RegistryConflict(f"deployment {name!r} kept changing under this write")

    async def update_adapter(
        self, team: str, name: str, change: AdapterChange, attempts: int = 3
    ) -> AdapterRecord | None:
        """Apply `change` to team `team`'s adapter `name` and write the result (None: delete
        it); retried on a conflicting write. `change` may raise to refuse. Returns the record
        that won (None once deleted)."""
        key = adapter_key(team, name)
        for _ in range(attempts):
            current = self._adapters.get(key)
            wanted = change(current)
            if wanted == current:
                return current
            if wanted is None:  # a deletion always wins: nothing is left to compare
                await self.wait_folded(await self._log.publish(key, None))
                log.info("registry_written", adapter=key, deleted=True)
                return None
            record = self._stamped(wanted, current)
            if (won := await self._write(key, record, self._adapters)) is not None:
                log.info("registry_written", adapter=key, revision=record.revision)
                return won
            log.info("registry_write_lost", adapter=key)
        raise RegistryConflict(f"adapter {key!r} kept changing under this write")

    def _stamped(self, wanted: RecordT, current: RecordT | None) -> RecordT:
        """The record to write over `current`: the next revision, this writer's mark, now."""
        return wanted.model_copy(
            update={
                "revision": current.revision + 1 if current is not None else 1,
                "written_by": uuid.uuid4().hex,
                "updated_at": int(self._now()),
            }
        )

    async def _write(
        self, key: str, record: RecordT, folded: Mapping[str, RecordT]
    ) -> RecordT | None:
        """Publish `record` and fold the log up to it: the record when it won, None when a
        concurrent write to `key` did (optimistic concurrency through the log's order)."""
        await self.wait_folded(await self._log.publish(key, record))
        won = folded.get(key)
        return won if won is not None and won.written_by == record.written_by else None

    async def seed(self, deployments: list[Deployment]) -> None:
        """Register each configured deployment (`LLMQ_DEPLOYMENTS`) the registry lacks, as its
        version "1"; one the registry has is left as the registry says."""
        for deployment in deployments:
            if deployment.name in self._records:
                continue
            spec = spec_of(deployment).model_dump()
            seeded = first_record(deployment.name, Version(**spec, created_at=int(self._now())))

            def keep_or_seed(
                current: DeploymentRecord | None, seeded: DeploymentRecord = seeded
            ) -> DeploymentRecord:
                return current or seeded

            await self.update(deployment.name, keep_or_seed)
            log.info("registry_seeded", deployment=deployment.name)


def first_record(name: str, version: Version) -> DeploymentRecord:
    """The record of a new deployment: its one version takes all traffic."""
    return DeploymentRecord(
        name=name,
        revision=1,
        versions=(version,),
        traffic=TrafficSplit(stable=version.version),
        written_by="",
        updated_at=version.created_at,
    )
