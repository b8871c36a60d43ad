"""The operator page's state: the registry's deployments and traffic split, the replicas'
heartbeats, the backlog counters, the job topics' lag and this gateway's recent latencies, by
pool; the batches in progress; the newest dead letters."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from batch.state_port import BatchStore
from gateway.recent import RecentRequests
from gateway.services.topic_watch import TopicsSnapshot
from schemas.admin import (
    BATCHES_SHOWN,
    AdminState,
    BatchState,
    DeploymentState,
    PoolState,
    ReplicaState,
    VersionState,
)
from schemas.heartbeat import ReplicaHeartbeat
from schemas.registry import DeploymentRecord
from topics.catalog import PRIORITY_CLASSES
from topics.ports import QueueBacklog

Records = Callable[[], Mapping[str, DeploymentRecord]]
Replicas = Callable[[], Mapping[str, Sequence[ReplicaHeartbeat]]]
Topics = Callable[[], TopicsSnapshot | None]
BATCHES_LOOKED_AT = 10 * BATCHES_SHOWN
"""Active batches read per page refresh (the oldest shown are among these)."""


class AdminService:
    def __init__(
        self,
        records: Records,
        replicas: Replicas,
        backlog: QueueBacklog,
        recent: RecentRequests,
        gateway_id: str,
        *,
        batches: BatchStore,
        topics: Topics,
    ) -> None:
        self._batches = batches
        self._topics = topics
        self._records = records
        self._replicas = replicas
        self._backlog = backlog
        self._recent = recent
        self._gateway_id = gateway_id

    async def state(self) -> AdminState:
        by_pool: dict[str, list[DeploymentState]] = {}
        for record in sorted(self._records().values(), key=lambda r: r.name):
            stable = next(v for v in record.versions if v.version == record.traffic.stable)
            by_pool.setdefault(stable.pool, []).append(self._deployment(record))
        replicas = self._replicas()
        topics = self._topics()
        pools = []
        for pool in sorted(set(by_pool) | set(replicas)):
            queued = {tier: await self._backlog.queued(pool, tier) for tier in PRIORITY_CLASSES}
            pools.append(
                PoolState(
                    pool=pool,
                    deployments=by_pool.get(pool, []),
                    replicas=[_replica(r) for r in sorted(replicas.get(pool, []),
                                                          key=lambda r: r.replica_id)],
                    queued_prompt_tokens=queued,
                    job_topic_lag={tier: n for (p, tier), n in topics.lag.items() if p == pool}
                    if topics else {},
                )
            )  # fmt: skip
        return AdminState(
            generated_at=time.time(),
            window_s=self._recent.window_s,
            gateway_id=self._gateway_id,
            pools=pools,
            batches=await self._batches_in_progress(),
            dead_letters=topics.dead_letters if topics else None,
            recent_dead_letters=list(reversed(topics.recent_dead_letters)) if topics else [],
            topics_checked_at=topics.taken_at if topics else None,
        )

    async def _batches_in_progress(self) -> list[BatchState]:
        found = []
        for batch_id in (await self._batches.active())[:BATCHES_LOOKED_AT]:
            stored = await self._batches.get(batch_id)
            if stored is None:
                continue
            batch, counts = stored.batch, stored.batch.request_counts
            found.append(
                BatchState(id=batch.id, team=stored.team, model=batch.model, status=batch.status,
                           total=counts.total, completed=counts.completed, failed=counts.failed,
                           created_at=batch.created_at)
            )  # fmt: skip
        return sorted(found, key=lambda b: (b.created_at, b.id))[:BATCHES_SHOWN]

    def _deployment(self, record: DeploymentRecord) -> DeploymentState:
        split = record.traffic
        stable = next(v for v in record.versions if v.version == split.stable)
        live = [v for v in record.versions if v.lifecycle != "retired"]
        canary = split.canary_percent if split.canary else 0.0

        def share(version: str) -> float:
            if version == split.stable:
                return 100.0 - canary
            return canary if version == split.canary else 0.0

        return DeploymentState(
            name=record.name,
            versions=[VersionState(version=v.version, lifecycle=v.lifecycle,
                                   share_percent=share(v.version)) for v in live],
            ttft_slo_s=stable.ttft_slo_s,
            tpot_slo_s=stable.tpot_slo_s,
            ttft_p95_s=self._recent.p95(record.name, "ttft"),
            tpot_p95_s=self._recent.p95(record.name, "tpot"),
            requests=self._recent.outcomes(record.name),
        )  # fmt: skip


def _replica(beat: ReplicaHeartbeat) -> ReplicaState:
    return ReplicaState(
        replica_id=beat.replica_id, state=beat.state, healthy=beat.healthy,
        kv_cache_usage=beat.kv_cache_usage, running=beat.running, waiting=beat.waiting,
        adapters=list(beat.adapters), engine=beat.engine,
    )  # fmt: skip
