"""Changes of a deployment's traffic split, as pure functions of its record: what the admin
API (an operator) and the rollout controller both write. Each appends a `RolloutEvent` to the
record's history. Callers check that the change is allowed; these only apply it."""

from __future__ import annotations

from typing import Literal

from schemas.registry import DeploymentRecord, DeploymentVersion, Lifecycle, TrafficSplit
from schemas.rollout import Rollout, RolloutAction, RolloutEvent

HISTORY_KEPT = 50
EVALUATIONS_KEPT = 10
By = Literal["operator", "controller"]

NUMERICS_ENGINE_ARGS = ("quantization", "kv_cache_dtype", "dtype")
"""`engine_args` that change a version's numerics as much as its precision does."""


def numerics_change(candidate: DeploymentVersion, reference: DeploymentVersion) -> str | None:
    """How `candidate` computes differently from `reference` (None: the same numerics): other
    precision, other weights (a rebuild, a quantisation, a conversion) or engine arguments
    that change numerics. Such a version must pass the evaluation suite against the reference
    before it takes traffic. (A different model is a new deployment, not a version.)"""
    if candidate.precision != reference.precision:
        return f"runs in {candidate.precision}, the stable version in {reference.precision}"
    if _weights(candidate) != _weights(reference):
        return "loads other weights than the stable version"
    for arg in NUMERICS_ENGINE_ARGS:
        if candidate.engine_args.get(arg) != reference.engine_args.get(arg):
            return f"sets engine argument `{arg}` differently from the stable version"
    return None


def _weights(version: DeploymentVersion) -> str:
    """What names a version's weights: their SHA-256 when known, else where they are."""
    return version.sha256 or version.weights_uri or version.path


def _event(
    record: DeploymentRecord,
    at: float,
    action: RolloutAction,
    version: str,
    percent: float,
    by: By,
    reason: str = "",
) -> tuple[RolloutEvent, ...]:
    event = RolloutEvent(
        at=at, action=action, version=version, percent=percent, by=by, reason=reason
    )
    return (*record.history, event)[-HISTORY_KEPT:]


def with_lifecycle(
    record: DeploymentRecord, version: str, lifecycle: Lifecycle
) -> tuple[DeploymentVersion, ...]:
    return tuple(
        v.model_copy(update={"lifecycle": lifecycle}) if v.version == version else v
        for v in record.versions
    )


def start_canary(
    record: DeploymentRecord, version: str, rollout: Rollout, by: By = "operator"
) -> DeploymentRecord:
    """`version` takes the rollout's first step of traffic."""
    traffic = TrafficSplit(
        stable=record.traffic.stable,
        canary=version,
        canary_percent=rollout.percent,
        rollout=rollout,
    )
    history = _event(record, rollout.step_started_at, "canary", version, rollout.percent, by)
    return record.model_copy(update={"traffic": traffic, "history": history})


def step_canary(record: DeploymentRecord, at: float, reason: str) -> DeploymentRecord:
    """The canary takes its rollout's next step of traffic (below 100: see `promote`)."""
    rollout = record.traffic.rollout
    assert rollout is not None and record.traffic.canary is not None
    stepped = rollout.model_copy(update={"step": rollout.step + 1, "step_started_at": at})
    traffic = record.traffic.model_copy(
        update={"canary_percent": stepped.percent, "rollout": stepped}
    )
    history = _event(
        record, at, "stepped", record.traffic.canary, stepped.percent, "controller", reason
    )
    return record.model_copy(update={"traffic": traffic, "history": history})


def promote(record: DeploymentRecord, at: float, by: By, reason: str = "") -> DeploymentRecord:
    """The canary becomes the stable version and takes every request; the old stable version
    drains (its streams finish; it takes no new requests)."""
    canary = record.traffic.canary
    assert canary is not None
    return record.model_copy(
        update={
            "traffic": TrafficSplit(stable=canary),
            "versions": with_lifecycle(record, record.traffic.stable, "draining"),
            "history": _event(record, at, "promoted", canary, 100.0, by, reason),
        }
    )


def roll_back(record: DeploymentRecord, at: float, by: By, reason: str = "") -> DeploymentRecord:
    """Every request goes back to the stable version; the canary drains."""
    canary = record.traffic.canary
    assert canary is not None
    return record.model_copy(
        update={
            "traffic": TrafficSplit(stable=record.traffic.stable),
            "versions": with_lifecycle(record, canary, "draining"),
            "history": _event(record, at, "rolled_back", canary, 0.0, by, reason),
        }
    )


def fail(record: DeploymentRecord, version: str, at: float, reason: str) -> DeploymentRecord:
    """`version`'s replicas cannot run: it is `failed` (no replica, no traffic, `reason` kept).
    A failed canary's share goes back to the stable version at once; a failed stable version
    keeps the split (there is nothing else to serve), and its requests fail until an operator
    registers a version that runs."""
    versions = tuple(
        v.model_copy(update={"lifecycle": "failed", "failure": reason})
        if v.version == version
        else v
        for v in record.versions
    )
    traffic = record.traffic
    if traffic.canary == version:
        traffic = TrafficSplit(stable=traffic.stable)
    percent = traffic.canary_percent if traffic.canary is not None else 0.0
    history = _event(record, at, "failed", version, percent, "controller", reason)
    return record.model_copy(update={"versions": versions, "traffic": traffic, "history": history})
