"""The pool controller: replicas follow the registry.

Each active version should run `replicas.min` replicas (its warm floor); a draining or retired
version none. The controller compares that with what runs and starts or stops replicas
through a `ReplicaRunner` (local worker processes for `llmq dev up`; Kubernetes in
production). A draining version's replicas are stopped only once its job topics hold no
waiting work (a worker stopped with jobs still queued for its pool would strand them);
stopping a worker drains it (it finishes its streams, commits and exits). A draining version
with no replica left is marked `retired` in the registry. A version whose replicas cannot run
(the runner's `failures()`: weights that do not verify, a crash loop) is marked `failed`: it
gets no replica and no traffic (a failed canary's share goes back to the stable version).
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog

from control import traffic
from control.registry import DeploymentRegistry
from control.rounds import Rounds
from schemas.registry import DeploymentRecord, DeploymentVersion
from topics.catalog import PRIORITY_CLASSES
from topics.ports import QueueBacklog
from workers.exit_codes import WEIGHTS_EXIT_CODE

log = structlog.get_logger()

VersionKey = tuple[str, str]
"""(deployment name, version)."""


class ReplicaRunner(Protocol):
    """Starts and stops the replicas (workers) of deployment versions."""

    def running(self) -> dict[VersionKey, int]:
        """Replicas per version that run and are not being stopped."""
        ...

    async def start(self, name: str, version: DeploymentVersion) -> None:
        """Start one replica of `version` of deployment `name` (returns once it is spawned)."""
        ...

    async def stop_one(self, key: VersionKey) -> None:
        """Drain and stop one replica of `key` (returns once it is told to stop)."""
        ...

    async def failures(self) -> dict[VersionKey, str]:
        """Versions whose replicas cannot run, with what they did: weights that do not
        verify (`WEIGHTS_EXIT_CODE`), or a crash loop. Restarting them cannot help."""
        ...


WEIGHTS_FAILURE = (
    "its weights are missing or do not match its sha256 "
    f"(a replica exited with code {WEIGHTS_EXIT_CODE})"
)


def crash_loop(exits: int, within: str, last_code: int | None) -> str:
    """What a version whose replicas keep exiting failed of."""
    return f"crash loop: its replicas exited {exits} times {within} (last exit code {last_code})"


def desired_replicas(version: DeploymentVersion) -> int:
    return version.replicas.min if version.lifecycle == "active" else 0


class PoolController(Rounds):
    def __init__(
        self,
        registry: DeploymentRegistry,
        runner: ReplicaRunner,
        backlog: QueueBacklog,
        interval_s: float = 1.0,
        managed: frozenset[str] = frozenset(),
        autoscaled: bool = False,
    ) -> None:
        super().__init__("pool-controller", interval_s)
        self._managed = managed
        self._autoscaled = autoscaled
        """An autoscaler (KEDA) moves active versions between their bounds: the controller
        only brings one up to `replicas.min` or down to `replicas.max`."""
        self._registry = registry
        self._runner = runner
        self._backlog = backlog

    async def _waiting(self, pool: str) -> int:
        return sum([await self._backlog.queued(pool, tier) for tier in PRIORITY_CLASSES])

    async def reconcile(self) -> None:
        """One round: start and stop replicas towards what the registry wants; retire
        drained versions."""
        records = {
            name: record
            for name, record in self._registry.records.items()
            if not self._managed or name in self._managed
        }
        running = self._runner.running()
        failures = await self._runner.failures()
        wanted: set[VersionKey] = set()
        for record in records.values():
            for version in record.versions:
                key = (record.name, version.version)
                wanted.add(key)
                have, want = running.get(key, 0), desired_replicas(version)
                if self._autoscaled and version.lifecycle == "active":
                    want = min(max(have, want), version.replicas.max)
                if key in failures and version.lifecycle == "active":
                    await self._fail(record, version.version, failures[key])
                    want = 0
                for _ in range(want - have):
                    log.info(
                        "replica_starting", deployment=key[0], version=key[1], pool=version.pool
                    )
                    await self._runner.start(record.name, version)
                if have > want:
                    waiting = await self._waiting(version.pool)
                    if version.lifecycle == "draining" and waiting:
                        log.info("drain_waiting", deployment=key[0], version=key[1], jobs=waiting)
                        continue
                    for _ in range(have - want):
                        log.info("replica_stopping", deployment=key[0], version=key[1])
                        await self._runner.stop_one(key)
                if version.lifecycle == "draining" and not have:
                    await self._retire(record, version.version)
        for key, have in running.items():
            if key not in wanted and (not self._managed or key[0] in self._managed):  # deleted
                for _ in range(have):
                    await self._runner.stop_one(key)

    async def _fail(self, record: DeploymentRecord, version: str, reason: str) -> None:
        def mark(current: DeploymentRecord | None) -> DeploymentRecord | None:
            found = current.version(version) if current is not None else None
            if current is None or found is None or found.lifecycle != "active":
                return current
            return traffic.fail(current, version, time.time(), reason)

        await self._registry.update(record.name, mark)
        log.error("version_failed", deployment=record.name, version=version, reason=reason)

    async def _retire(self, record: DeploymentRecord, version: str) -> None:
        def retire(current: DeploymentRecord | None) -> DeploymentRecord | None:
            if current is None:
                return None
            versions = tuple(
                v.model_copy(update={"lifecycle": "retired"})
                if v.version == version and v.lifecycle == "draining"
                else v
                for v in current.versions
            )
            return current.model_copy(update={"versions": versions})

        await self._registry.update(record.name, retire)
        log.info("version_retired", deployment=record.name, version=version)
