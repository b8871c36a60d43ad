"""The operator page's state: the registry's deployments and traffic split, the replicas'
heartbeats, the backlog counters, and this gateway's recent latencies, by pool."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from gateway.recent import RecentRequests
from schemas.admin import AdminState, DeploymentState, PoolState, ReplicaState, VersionState
from schemas.heartbeat import ReplicaHeartbeat
from schemas.registry import DeploymentRecord
from topics.catalog import PRIORITY_CLASSES
from topics.ports import QueueBacklog

Records = Callable[[], Mapping[str, DeploymentRecord]]
Replicas = Callable[[], Mapping[str, Sequence[ReplicaHeartbeat]]]


class AdminService:
    def __init__(
        self,
        records: Records,
        replicas: Replicas,
        backlog: QueueBacklog,
        recent: RecentRequests,
        gateway_id: str,
    ) -> None:
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
                )
            )  # fmt: skip
        return AdminState(
            generated_at=time.time(),
            window_s=self._recent.window_s,
            gateway_id=self._gateway_id,
            pools=pools,
        )

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
