"""The operator page's state: deployments by pool with their traffic split and recent
latencies against their SLOs, replicas, and what waits in the job topics."""

from __future__ import annotations

from control.registry import DeploymentRegistry, first_record
from gateway.recent import RecentRequests
from gateway.services.admin import AdminService
from schemas.heartbeat import ReplicaHeartbeat
from schemas.registry import DeploymentRecord, DeploymentVersion, TrafficSplit
from tests.unit.test_registry import MemoryRegistryLog


class Backlog:
    async def queued(self, pool: str, tier: str) -> int:
        return {("big", "interactive"): 1200, ("big", "batch"): 50_000}.get((pool, tier), 0)


def version(name: str, pool: str = "big", **fields: object) -> DeploymentVersion:
    return DeploymentVersion.model_validate(
        {"version": name, "path": "/m", "pool": pool, "created_at": 1, "ttft_slo_s": 1.0,
         **fields}
    )  # fmt: skip


def test_the_window_keeps_the_last_minutes_and_counts_outcomes() -> None:
    recent = RecentRequests(window_s=60)
    for i in range(100):
        recent.ttft("m", i / 100, now=1000.0)
    assert recent.p95("m", "ttft", now=1000.0) == 0.94  # nearest rank of 0.00 .. 0.99
    recent.ttft("m", 5.0, now=1050.0)
    assert recent.p95("m", "ttft", now=1070.0) == 5.0  # the old ones left the window
    assert recent.p95("m", "tpot") is None and recent.p95("other", "ttft") is None
    recent.finished("m", "ok")
    recent.finished("m", "ok")
    recent.finished("m", "timeout")
    assert recent.outcomes("m") == {"ok": 2, "timeout": 1}


async def test_state_groups_deployments_and_replicas_by_pool() -> None:
    registry = DeploymentRegistry(MemoryRegistryLog())
    await registry.start()
    try:
        canaried = first_record("llama", version("1")).model_copy(
            update={
                "versions": (version("1"), version("2")),
                "traffic": TrafficSplit(stable="1", canary="2", canary_percent=5.0),
            }
        )

        def write(record: DeploymentRecord) -> object:
            return lambda _: record

        await registry.update("llama", write(canaried))  # type: ignore[arg-type]
        await registry.update("tiny", write(first_record("tiny", version("1", pool="small"))))  # type: ignore[arg-type]
        recent = RecentRequests()
        recent.ttft("llama", 1.5)
        recent.finished("llama", "ok")
        beats = {
            "big": [
                ReplicaHeartbeat(replica_id="w-2", pool="big", model="llama", state="loading",
                                 sent_at=1),
                ReplicaHeartbeat(replica_id="w-1", pool="big", model="llama", state="ready",
                                 kv_cache_usage=0.4, running=7, adapters=("t/a",), sent_at=1),
            ]
        }  # fmt: skip
        service = AdminService(lambda: registry.records, lambda: beats, Backlog(), recent, "g1")
        state = await service.state()
    finally:
        await registry.stop()
    assert [p.pool for p in state.pools] == ["big", "small"]
    big = state.pools[0]
    llama = big.deployments[0]
    assert [(v.version, v.share_percent) for v in llama.versions] == [("1", 95.0), ("2", 5.0)]
    assert (llama.ttft_p95_s, llama.ttft_slo_s, llama.requests) == (1.5, 1.0, {"ok": 1})
    assert [r.replica_id for r in big.replicas] == ["w-1", "w-2"]
    assert big.replicas[0].adapters == ["t/a"] and big.replicas[0].running == 7
    assert big.queued_prompt_tokens == {"interactive": 1200, "batch": 50_000}
    assert state.pools[1].replicas == [] and state.gateway_id == "g1"
