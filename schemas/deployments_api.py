"""The admin API's deployment objects (`/v1/deployments`): the registry's record of a
deployment, with what the replicas' heartbeats add (each version's state and ready replicas)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.deployment import ReplicaBounds
from schemas.registry import DeploymentRecord, DeploymentVersion, TrafficSplit
from schemas.rollout import EvalResult, RolloutEvent, RolloutPolicy

VersionState = Literal["loading", "ready", "draining", "retired", "failed"]
"""`loading`: active, no ready replica yet; `ready`: active with one or more; `draining`:
taking no new requests, finishing its streams; `retired`: gone (its name stays taken)."""
Arm = Literal["stable", "canary", "none"]


class DeploymentVersionObject(DeploymentVersion):
    state: VersionState
    ready_replicas: int
    arm: Arm
    """Which share of traffic this version takes: all but the canary's, the canary's, none."""


class DeploymentObject(BaseModel):
    object: Literal["deployment"] = "deployment"
    id: str
    """The deployment's name (what callers put in `model`)."""
    revision: int
    """The registry's revision of this deployment (one more per change)."""
    updated_at: int
    traffic: TrafficSplit
    versions: list[DeploymentVersionObject]
    history: list[RolloutEvent]
    """Its traffic changes, oldest first: canaries, steps, promotions, rollbacks and why."""

    @classmethod
    def of(cls, record: DeploymentRecord, ready: dict[str, int]) -> DeploymentObject:
        """`ready`: ready replicas per pool."""
        versions = []
        for v in record.versions:
            replicas = ready.get(v.pool, 0)
            state: VersionState
            if v.lifecycle == "active":
                state = "ready" if replicas else "loading"
            else:
                state = v.lifecycle
            arm: Arm = (
                "stable"
                if v.version == record.traffic.stable
                else "canary"
                if v.version == record.traffic.canary
                else "none"
            )
            fields = v.model_dump()
            versions.append(
                DeploymentVersionObject(**fields, state=state, ready_replicas=replicas, arm=arm)
            )
        return cls(
            id=record.name,
            revision=record.revision,
            updated_at=record.updated_at,
            traffic=record.traffic,
            versions=versions,
            history=list(record.history),
        )


class DeploymentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeploymentObject]


class CanaryRequest(BaseModel):
    """`POST /v1/deployments/{name}:canary`."""

    model_config = ConfigDict(extra="forbid")

    version: str
    """A registered, active version other than the stable one."""
    percent: float | None = Field(default=None, gt=0.0, le=100.0)
    """A fixed share of the deployment's requests (those not pinned) that the canary keeps
    until an operator promotes or rolls it back (a regression still rolls it back). Omitted:
    an automatic rollout through `policy.steps` (5% -> 25% -> 100% by default)."""
    policy: RolloutPolicy | None = None
    """How the rollout steps and what counts as a regression (defaults: `RolloutPolicy`)."""


class EvaluationRequest(BaseModel):
    """`POST /v1/deployments/{name}:evaluations`: record an evaluation of a version (what
    `llmq eval` posts)."""

    model_config = ConfigDict(extra="forbid")

    version: str
    """The evaluated version."""
    result: EvalResult


class ScaleRequest(BaseModel):
    """`PATCH /v1/deployments/{name}`: a version's replica bounds (its capacity)."""

    model_config = ConfigDict(extra="forbid")

    version: str
    replicas: ReplicaBounds
