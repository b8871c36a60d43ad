"""TTFT-based admission: refuse (429 + Retry-After) before any stream opens when the SLO
cannot be met.

Predicted TTFT = (overhead + (queued prompt tokens + own prompt tokens) / pool prefill rate)
x the pool's calibration factor, learnt from the actual TTFTs of earlier requests (what the
model leaves out: the engine step that makes the first token, batched prefill, the hop).
The queued tokens come from a per-pool backlog counter (the gateway adds on produce, the worker
removes when it starts or drops a job); the rate is the sum of ready replicas' measured prefill
rates. Batch work is never refused here: it waits in its own topic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.chat import Tier
from schemas.messages import ReplicaHeartbeat

_EPSILON = 1e-9


@dataclass(frozen=True)
class AdmissionDecision:
    """Whether a request may be queued now; if not, when to retry."""

    admitted: bool
    predicted_ttft_s: float
    retry_after_s: int | None = None


def pool_prefill_rate(replicas: Sequence[ReplicaHeartbeat]) -> float:
    """Sum of the measured prefill rates (tokens/s) of the ready, healthy replicas."""
    return sum(
        r.prefill_tokens_per_s
        for r in replicas
        if r.state == "ready" and r.healthy and r.prefill_tokens_per_s > 0
    )


class TtftPredictor:
    """Time to first token from the queue ahead of a request and the pool's prefill rate."""

    def __init__(
        self, *, overhead_s: float = 0.05, fallback_prefill_tokens_per_s: float = 2_000.0
    ) -> None:
        if overhead_s < 0 or fallback_prefill_tokens_per_s <= 0:
            raise ValueError("overhead must be >= 0 and the fallback rate > 0")
        self.overhead_s = overhead_s
        self.fallback_prefill_tokens_per_s = fallback_prefill_tokens_per_s

    def rate(self, prefill_tokens_per_s: float) -> float:
        """The measured rate, or the fallback while nothing has been measured (0)."""
        if prefill_tokens_per_s > 0:
            return prefill_tokens_per_s
        return self.fallback_prefill_tokens_per_s

    def predict(
        self, *, prompt_tokens: int, queued_tokens: int, prefill_tokens_per_s: float
    ) -> float:
        rate = self.rate(prefill_tokens_per_s)
        return self.overhead_s + (max(queued_tokens, 0) + prompt_tokens) / rate


class TtftCalibration:
    """Per pool, how much longer (or shorter) TTFTs actually are than predicted: a moving
    average, in log space, of actual / predicted, applied to later predictions."""

    def __init__(self, weight: float = 0.2, bounds: tuple[float, float] = (0.25, 8.0)) -> None:
        if not 0 < weight <= 1 or not 0 < bounds[0] <= 1 <= bounds[1]:
            raise ValueError("the weight lies in (0, 1] and the bounds around 1")
        self.weight = weight
        self._log_bounds = (math.log(bounds[0]), math.log(bounds[1]))
        self._log_factor: dict[str, float] = {}

    def factor(self, pool: str) -> float:
        """What to multiply the pool's raw predictions by (1 until something is observed)."""
        return math.exp(self._log_factor.get(pool, 0.0))

    def observe(self, pool: str, predicted_s: float, actual_s: float) -> float:
        """Learn from one request whose calibrated prediction was `predicted_s`; return the
        pool's new factor."""
        if predicted_s > 0 and actual_s > 0:
            low, high = self._log_bounds
            step = self.weight * math.log(actual_s / predicted_s)
            self._log_factor[pool] = min(max(self._log_factor.get(pool, 0.0) + step, low), high)
        return self.factor(pool)


class AdmissionController:
    """Admit interactive requests whose predicted TTFT meets the pool's SLO. Pure logic.

    A prompt too long to meet the SLO even on an idle pool is judged against its idle-pool TTFT
    instead (it is admitted once nothing is queued ahead of it): no Retry-After could help it.
    """

    def __init__(
        self, predictor: TtftPredictor | None = None, *, default_slo_s: float = 1.0
    ) -> None:
        if default_slo_s <= 0:
            raise ValueError("the TTFT SLO must be positive")
        self.predictor = predictor or TtftPredictor()
        self.default_slo_s = default_slo_s
        self.calibration = TtftCalibration()

    def predict(
        self, *, prompt_tokens: int, queued_tokens: int, prefill_tokens_per_s: float, factor: float
    ) -> float:
        """The calibrated TTFT prediction (the raw one x the pool's factor)."""
        raw = self.predictor.predict(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
        )
        return raw * factor

    def queue_limit(
        self,
        *,
        prompt_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        factor: float = 1.0,
    ) -> int:
        """The most queued prompt tokens (this request's included) that still meet the SLO.

        The backlog adapter applies it atomically, so concurrent admissions cannot overshoot.
        """
        rate = self.predictor.rate(prefill_tokens_per_s)
        overhead = self.predictor.overhead_s
        idle_ttft = overhead + prompt_tokens / rate
        budget_s = max((self.default_slo_s if slo_s is None else slo_s) / factor, idle_ttft)
        return math.floor((budget_s - overhead) * rate + _EPSILON)

    def decide(
        self,
        *,
        tier: Tier,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        factor: float = 1.0,
    ) -> AdmissionDecision:
        """Admit, or refuse with the whole seconds until the backlog has drained enough.
        Budgets are in raw predicted seconds: the SLO divided by the calibration factor."""
        raw = self.predictor.predict(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
        )
        predicted = raw * factor
        if tier == "batch":
            return AdmissionDecision(admitted=True, predicted_ttft_s=predicted)
        rate = self.predictor.rate(prefill_tokens_per_s)
        overhead = self.predictor.overhead_s
        idle_ttft = overhead + prompt_tokens / rate
        budget_s = max((self.default_slo_s if slo_s is None else slo_s) / factor, idle_ttft)
        if raw <= budget_s + _EPSILON:
            return AdmissionDecision(admitted=True, predicted_ttft_s=predicted)
        excess_tokens = max(queued_tokens, 0) + prompt_tokens - (budget_s - overhead) * rate
        retry_after = max(1, math.ceil(excess_tokens / rate - _EPSILON))
        return AdmissionDecision(
            admitted=False, predicted_ttft_s=predicted, retry_after_s=retry_after
        )
