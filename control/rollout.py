"""The rollout controller: canaries step forward while healthy and roll back on regression.

Gateways record each finished request of a deployment in rollout (its arm: stable or canary)
as an `ArmSample` (`ArmStats`). Each round the controller takes, per canary, the samples of
both arms since the current step began and compares them (`judge`): TTFT p95, TPOT p95 and
the share of failed requests. A regression rolls the canary back at once (whatever the step,
and for a canary an operator holds at a fixed share too); a step that has lasted its time with
enough requests on both arms and no regression moves to the next share, and reaching 100%
promotes the canary. Every decision is a `RolloutEvent` in the record, with its numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from control.registry import DeploymentRegistry
from control.rounds import Rounds
from control.traffic import promote, roll_back, step_canary
from schemas.registry import DeploymentRecord
from schemas.rollout import ArmSample, RolloutPolicy
from topics.ports import ArmStats

log = structlog.get_logger()


def p95(values: Sequence[float]) -> float | None:
    """The nearest-rank 95th percentile: from 20 values on, one outlier (a version's first
    request, which pays for connections and metadata) is not the answer."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True)
class ArmSummary:
    requests: int
    errors: int
    ttft_p95_s: float | None
    tpot_p95_s: float | None

    @classmethod
    def of(cls, samples: Sequence[ArmSample]) -> ArmSummary:
        return cls(
            requests=len(samples),
            errors=sum(not s.ok for s in samples),
            ttft_p95_s=p95([s.ttft_s for s in samples if s.ttft_s is not None]),
            tpot_p95_s=p95([s.tpot_s for s in samples if s.tpot_s is not None]),
        )

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def describe(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.0f} ms"

        return (
            f"{self.requests} requests, {self.errors} failed, TTFT p95 {ms(self.ttft_p95_s)}, "
            f"TPOT p95 {ms(self.tpot_p95_s)}"
        )


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["regressed", "healthy", "waiting"]
    """`waiting`: too few requests on an arm to tell."""
    reason: str


def judge(stable: ArmSummary, canary: ArmSummary, policy: RolloutPolicy) -> Verdict:
    """Compare a canary's arm with the stable one's over the same window."""
    numbers = f"canary: {canary.describe()}; stable: {stable.describe()}"
    if canary.requests < policy.min_requests or stable.requests < policy.min_requests:
        return Verdict("waiting", numbers)
    if canary.error_rate > stable.error_rate + policy.max_error_rate_increase:
        return Verdict("regressed", f"error rate {canary.error_rate:.1%} ({numbers})")
    checks = (
        ("TTFT", canary.ttft_p95_s, stable.ttft_p95_s, policy.max_ttft_p95_ratio,
         policy.ttft_slack_s),
        ("TPOT", canary.tpot_p95_s, stable.tpot_p95_s, policy.max_tpot_p95_ratio,
         policy.tpot_slack_s),
    )  # fmt: skip
    for metric, ours, theirs, ratio, slack in checks:
        if ours is not None and theirs is not None and ours > theirs * ratio + slack:
            return Verdict("regressed", f"{metric} p95 {ours / theirs:.2f}x stable ({numbers})")
    return Verdict("healthy", numbers)


class RolloutController(Rounds):
    def __init__(
        self,
        registry: DeploymentRegistry,
        stats: ArmStats,
        interval_s: float = 2.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        super().__init__("rollout-controller", interval_s)
        self._registry = registry
        self._stats = stats
        self._now = now

    async def reconcile(self) -> None:
        """One round over every deployment with a canary."""
        for record in self._registry.records.values():
            if record.traffic.canary is not None and record.traffic.rollout is not None:
                await self._judge(record)

    async def _judge(self, record: DeploymentRecord) -> None:
        traffic = record.traffic
        rollout = traffic.rollout
        assert rollout is not None and traffic.canary is not None
        since = rollout.step_started_at
        stable = ArmSummary.of(await self._stats.since(f"{record.name}@{traffic.stable}", since))
        canary = ArmSummary.of(await self._stats.since(f"{record.name}@{traffic.canary}", since))
        verdict = judge(stable, canary, rollout.policy)
        now = self._now()
        policy = rollout.policy
        if verdict.outcome == "regressed":
            action = "rolled_back"
        elif (
            verdict.outcome == "healthy"
            and policy.auto_promote
            and now - since >= policy.min_step_s
        ):
            last = rollout.step + 1 >= len(policy.steps) or policy.steps[rollout.step + 1] >= 100
            action = "promoted" if last else "stepped"
        else:
            return

        def change(current: DeploymentRecord | None) -> DeploymentRecord | None:
            # Only the rollout this verdict judged: an operator may have acted meanwhile.
            if current is None or current.traffic != traffic:
                return current
            if action == "rolled_back":
                return roll_back(current, now, "controller", verdict.reason)
            if action == "promoted":
                return promote(current, now, "controller", verdict.reason)
            return step_canary(current, now, verdict.reason)

        await self._registry.update(record.name, change)
        log.info(
            f"canary_{action}",
            deployment=record.name,
            version=traffic.canary,
            percent=traffic.canary_percent,
            canary_requests=canary.requests,
            stable_requests=stable.requests,
            reason=verdict.reason,
        )
