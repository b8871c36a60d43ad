"""The operator page's state: deployments by pool with their traffic split and recent
latencies against their SLOs, replicas, what waits in the job topics, batches in progress and
the newest dead letters."""

from __future__ import annotations

from batch.state_port import StoredBatch
from control.registry import DeploymentRegistry, first_record
from gateway.recent import RecentRequests
from gateway.services.admin import AdminService
from gateway.services.topic_watch import TopicsSnapshot
from schemas.admin import DeadLetterState
from schemas.batches import Batch, BatchRequestCounts
from schemas.heartbeat import ReplicaHeartbeat
from schemas.registry import DeploymentRecord, DeploymentVersion, TrafficSplit
from tests.unit.test_registry import MemoryRegistryLog


class Backlog:
    async def queued(self, pool: str, tier: str) -> int:
        return {("big", "interactive"): 1200, ("big", "batch"): 50_000}.get((pool, tier), 0)


class Batches:
    """The two methods of the batch store the page reads."""

    def __init__(self, *batches: Batch) -> None:
        self._batches = {b.id: b for b in batches}

    async def active(self) -> list[str]:
        return sorted(self._batches)

    async def get(self, batch_id: str) -> StoredBatch | None:
        return StoredBatch(self._batches[batch_id], team="t", cursor=0, pool="big")


def batch(batch_id: str, created_at: int, **counts: int) -> Batch:
    return Batch(
        id=batch_id, object="batch", endpoint="/v1/chat/completions", input_file_id="f",
        completion_window="24h", status="in_progress", created_at=created_at, model="llama",
        request_counts=BatchRequestCounts(**counts),
    )  # fmt: skip


def letter(offset: int) -> DeadLetterState:
    return DeadLetterState(reason="unparseable", detail="not JSON", request_id=None,
                           topic="llmq.jobs.big.interactive", partition=0, offset=offset,
                           failed_at=1.0, attempts=1)  # fmt: skip


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
        topics = TopicsSnapshot(
            taken_at=5.0,
            lag={("big", "interactive"): 3, ("big", "batch"): 900},
            dead_letters=2,
            recent_dead_letters=(letter(7), letter(9)),  # newest last, as the topic holds them
        )
        service = AdminService(
            lambda: registry.records, lambda: beats, Backlog(), recent, "g1",
            batches=Batches(batch("b-new", 20, total=5), batch("b-old", 10, total=4, completed=1)),
            topics=lambda: topics,
        )  # fmt: skip
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
    assert big.job_topic_lag == {"interactive": 3, "batch": 900}
    assert state.pools[1].job_topic_lag == {}
    assert [(b.id, b.total, b.completed) for b in state.batches] == [
        ("b-old", 4, 1),
        ("b-new", 5, 0),
    ]
    assert state.dead_letters == 2 and state.topics_checked_at == 5.0
    assert [d.offset for d in state.recent_dead_letters] == [9, 7]  # newest first


async def test_before_the_topic_watcher_looked_nothing_is_made_up() -> None:
    registry = DeploymentRegistry(MemoryRegistryLog())
    await registry.start()
    try:
        await registry.update("tiny", lambda _: first_record("tiny", version("1", pool="small")))  # type: ignore[arg-type,return-value]
        service = AdminService(lambda: registry.records, lambda: {}, Backlog(), RecentRequests(),
                               "g1", batches=Batches(), topics=lambda: None)  # fmt: skip
        state = await service.state()
    finally:
        await registry.stop()
    assert state.pools[0].job_topic_lag == {} and state.batches == []
    assert state.dead_letters is None and state.recent_dead_letters == []
    assert state.topics_checked_at is None
