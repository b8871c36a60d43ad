"""Rollouts and evaluations as the registry records them.

A canary runs under a `Rollout`: its policy (the steps of traffic it takes, how long and on
how many requests each step is judged, what counts as a regression) and where it stands. The
rollout controller compares the canary's arm with the stable one's (`ArmSample`s recorded by
the gateways) and steps it forward, promotes it, or rolls it back; each of those is a
`RolloutEvent` in the deployment's history, so a rollout can be audited afterwards.

An `EvalResult` is one run of the evaluation suite (or of shadow traffic) of a version against
a reference version. A version whose numerics differ from the stable one's takes no canary
traffic until a passing result against the stable version is recorded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RolloutAction = Literal["canary", "stepped", "promoted", "rolled_back", "failed"]
EvalKind = Literal["suite", "shadow"]


class RolloutPolicy(BaseModel):
    """How a canary is stepped forward and when it is rolled back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: tuple[float, ...] = (5.0, 25.0, 100.0)
    """Percent of traffic at each step, increasing; reaching 100 promotes the canary."""
    auto_promote: bool = True
    """Step forward (and promote) by itself while healthy; False: hold the first step until
    an operator promotes or rolls back (regressions still roll back)."""
    min_requests: int = Field(default=20, ge=1)
    """Finished requests each arm needs in a step before it is judged."""
    min_step_s: float = Field(default=60.0, ge=0.0)
    """Least time a step lasts before the next one."""
    max_ttft_p95_ratio: float = Field(default=1.5, gt=1.0)
    """Regression: the canary's TTFT p95 above the stable's times this (plus the slack)."""
    ttft_slack_s: float = Field(default=0.1, ge=0.0)
    """Absolute TTFT tolerance, so milliseconds of noise on a fast model are no regression."""
    max_tpot_p95_ratio: float = Field(default=1.5, gt=1.0)
    """Regression: the canary's TPOT p95 above the stable's times this (plus the slack)."""
    tpot_slack_s: float = Field(default=0.01, ge=0.0)
    max_error_rate_increase: float = Field(default=0.02, ge=0.0, le=1.0)
    """Regression: the canary's share of failed requests above the stable's plus this."""

    @model_validator(mode="after")
    def _increasing(self) -> RolloutPolicy:
        if not self.steps or any(not 0 < s <= 100 for s in self.steps):
            raise ValueError("steps must be percentages in (0, 100]")
        if list(self.steps) != sorted(set(self.steps)):
            raise ValueError("steps must increase")
        return self


class Rollout(BaseModel):
    """A canary's rollout in progress: its policy and current step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: RolloutPolicy = RolloutPolicy()
    step: int = Field(default=0, ge=0)
    """Index into `policy.steps` of the share the canary takes now."""
    step_started_at: float
    """Unix seconds the current step began: only requests after it are judged."""

    @property
    def percent(self) -> float:
        return self.policy.steps[self.step]


class RolloutEvent(BaseModel):
    """One change of a deployment's traffic, by an operator or by the rollout controller."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float
    action: RolloutAction
    version: str
    """The canary's version (or the version that failed)."""
    percent: float
    """The canary's share after the event (100 when promoted, 0 when rolled back or
    failed)."""
    by: Literal["operator", "controller"]
    reason: str = ""
    """Why the controller acted: the comparison that passed or regressed."""


class EvalResult(BaseModel):
    """One evaluation of a version against a reference version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EvalKind = "suite"
    """`suite`: the repository's prompts; `shadow`: real prompts read back from job topics."""
    suite: str
    """The suite's name and version (`default@1`), or `shadow`."""
    suite_sha256: str = ""
    """SHA-256 of the suite file: which prompts and thresholds were used."""
    reference: str
    """The version the answers were compared with."""
    passed: bool
    scores: dict[str, float]
    """`exact_match`, `token_overlap`, `json_valid`, `refusal_rate` (and the reference's
    `reference_json_valid`, `reference_refusal_rate`)."""
    thresholds: dict[str, float]
    prompts: int = Field(ge=0)
    ran_at: float


class ArmSample(BaseModel):
    """One finished request of a rollout's arm, as the gateway saw it (no prompt, no ids)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float
    """Unix seconds it finished."""
    ok: bool
    """False: it failed on the platform's side (engine error, timeout)."""
    ttft_s: float | None = None
    tpot_s: float | None = None
