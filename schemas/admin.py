"""What the operator page (`GET /admin/state`) shows: pools, their deployments' versions and
traffic split against their SLOs, their replicas, and what waits in their job topics."""

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


class AdminState(BaseModel):
    generated_at: float
    window_s: float
    gateway_id: str
    pools: list[PoolState]
