"""What the operator page (`GET /admin/state`) shows: pools, their deployments' versions and
traffic split against their SLOs, their replicas, what waits in their job topics, the batches
in progress and the newest dead letters."""

from __future__ import annotations

from pydantic import BaseModel


class VersionState(BaseModel):
    version: str
    lifecycle: str
    share_percent: float
    """Of the deployment's traffic this version takes."""


class DeploymentState(BaseModel):
    name: str
    versions: list[VersionState]
    ttft_slo_s: float
    tpot_slo_s: float | None
    ttft_p95_s: float | None
    """Over the gateway's last minutes (`window_s`); None without requests."""
    tpot_p95_s: float | None
    requests: dict[str, int]
    """Finished requests by outcome since this gateway started."""


class ReplicaState(BaseModel):
    replica_id: str
    state: str
    healthy: bool
    kv_cache_usage: float
    running: int
    waiting: int
    adapters: list[str]
    engine: str


class PoolState(BaseModel):
    pool: str
    deployments: list[DeploymentState]
    replicas: list[ReplicaState]
    queued_prompt_tokens: dict[str, int]
    """Admitted, not yet started, by class (interactive, batch)."""
    job_topic_lag: dict[str, int]
    """Job records its workers have not committed (waiting or running), by class; empty
    until the topic watcher's first look."""


class BatchState(BaseModel):
    """A batch not yet final."""

    id: str
    team: str
    model: str | None
    status: str
    total: int
    completed: int
    failed: int
    created_at: int


class DeadLetterState(BaseModel):
    """A dead letter without its payload (never content)."""

    reason: str
    detail: str
    request_id: str | None
    topic: str
    partition: int
    offset: int
    failed_at: float
    attempts: int


class AdminState(BaseModel):
    generated_at: float
    window_s: float
    gateway_id: str
    pools: list[PoolState]
    batches: list[BatchState]
    """Batches in progress (oldest first, at most `BATCHES_SHOWN`)."""
    dead_letters: int | None
    """Records on the dead-letter topic (None until the topic watcher's first look)."""
    recent_dead_letters: list[DeadLetterState]
    """The newest dead letters, newest first."""
    topics_checked_at: float | None
    """When the topic watcher last looked (lag and dead letters are from then)."""


BATCHES_SHOWN = 20
