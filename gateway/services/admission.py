"""TTFT-based admission: refuse (429 + Retry-After) before any stream opens when the SLO
cannot be met.

A request waits for two things before its first token: the prefill of what is queued ahead of
it (and its own), and, when every sequence slot of the pool is taken, a slot. Both are counted
in one unit, prefill-token equivalents: each queued job holds its prompt tokens plus its share
of slot time, ``slot_tokens`` = (mean slot-holding time of a job / the pool's slots) x the pool's
prefill rate. The slots free now take that many jobs without a wait, so they are credited:

    predicted TTFT = (overhead + max(ahead + own prompt + slot_tokens - free slots x
                     slot_tokens, own prompt) / prefill rate) x the pool's calibration factor

where `ahead` is what fair queuing serves before the request (a per-pool backlog counter, added
by the gateway on produce and removed by the worker when it starts the job), the rate the sum
of ready replicas' prefill rates, slots and slot times come from their heartbeats, and the
calibration factor is learnt from the actual TTFTs of earlier requests (what the model leaves
out: the engine step that makes the first token, batched prefill, the hop). With no slot
times measured yet, slot_tokens is 0 and only prefill counts. Batch work is never refused
here: it waits in its own topic.
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


@dataclass(frozen=True)
class PoolSlots:
    """A pool's sequence slots, from its ready replicas' heartbeats."""

    total: int = 0
    free: int = 0
    slot_s: float = 0.0
    """Mean slot-holding time of a job / total slots: how often, on average, a slot frees
    while all are busy (0 until a job has finished)."""

    def slot_tokens(self, prefill_tokens_per_s: float) -> int:
        """A job's share of slot time in prefill-token equivalents."""
        return math.ceil(self.slot_s * prefill_tokens_per_s - _EPSILON)


def pool_slots(replicas: Sequence[ReplicaHeartbeat]) -> PoolSlots:
    """Slots, free slots and slot time over the ready, healthy replicas that report them."""
    ready = [r for r in replicas if r.state == "ready" and r.healthy and r.max_num_seqs > 0]
    total = sum(r.max_num_seqs for r in ready)
    free = sum(max(r.max_num_seqs - r.in_flight, 0) for r in ready)
    timed = [r.mean_job_s for r in ready if r.mean_job_s > 0]
    slot_s = sum(timed) / len(timed) / total if timed and total else 0.0
    return PoolSlots(total, free, slot_s)


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
        self,
        *,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        slot_tokens: int = 0,
        free_slots: int = 0,
    ) -> float:
        """Overhead plus the prefill-token equivalents served before the first token (see
        the module docstring), at the pool's rate."""
        rate = self.rate(prefill_tokens_per_s)
        waited = max(queued_tokens, 0) + prompt_tokens + slot_tokens - free_slots * slot_tokens
        return self.overhead_s + max(waited, prompt_tokens) / rate


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
        self,
        *,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        factor: float,
        slots: PoolSlots = PoolSlots(),
    ) -> float:
        """The calibrated TTFT prediction (the raw one x the pool's factor)."""
        raw = self.predictor.predict(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            slot_tokens=slots.slot_tokens(self.predictor.rate(prefill_tokens_per_s)),
            free_slots=slots.free,
        )
        return raw * factor

    def queue_limit(
        self,
        *,
        prompt_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        factor: float = 1.0,
        slots: PoolSlots = PoolSlots(),
    ) -> int:
        """The most queued units (this request's `job_units` included) that still meet the
        SLO. The backlog adapter applies it atomically, so concurrent admissions cannot
        overshoot."""
        rate = self.predictor.rate(prefill_tokens_per_s)
        budget_s = self._budget_s(prompt_tokens, rate, slo_s, factor)
        credit = slots.free * slots.slot_tokens(rate)
        return math.floor((budget_s - self.predictor.overhead_s) * rate + _EPSILON) + credit

    def job_units(
        self, *, prompt_tokens: int, prefill_tokens_per_s: float, slots: PoolSlots
    ) -> int:
        """What one interactive job adds to the backlog: its prompt and its slot share."""
        return prompt_tokens + slots.slot_tokens(self.predictor.rate(prefill_tokens_per_s))

    def _budget_s(
        self, prompt_tokens: int, rate: float, slo_s: float | None, factor: float
    ) -> float:
        """The SLO in raw predicted seconds (SLO / calibration factor), never below what the
        prompt takes on an idle pool (such a prompt is admitted once nothing is ahead)."""
        idle_ttft = self.predictor.overhead_s + prompt_tokens / rate
        return max((self.default_slo_s if slo_s is None else slo_s) / factor, idle_ttft)

    def decide(
        self,
        *,
        tier: Tier,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        factor: float = 1.0,
        slots: PoolSlots = PoolSlots(),
    ) -> AdmissionDecision:
        """Admit, or refuse with the whole seconds until the backlog has drained enough.
        Budgets are in raw predicted seconds: the SLO divided by the calibration factor."""
        rate = self.predictor.rate(prefill_tokens_per_s)
        slot_tokens = slots.slot_tokens(rate)
        raw = self.predictor.predict(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            slot_tokens=slot_tokens,
            free_slots=slots.free,
        )
        predicted = raw * factor
        if tier == "batch":
            return AdmissionDecision(admitted=True, predicted_ttft_s=predicted)
        overhead = self.predictor.overhead_s
        budget_s = self._budget_s(prompt_tokens, rate, slo_s, factor)
        if raw <= budget_s + _EPSILON:
            return AdmissionDecision(admitted=True, predicted_ttft_s=predicted)
        waited = max(queued_tokens, 0) + prompt_tokens + slot_tokens - slots.free * slot_tokens
        excess_tokens = waited - (budget_s - overhead) * rate
        retry_after = max(1, math.ceil(excess_tokens / rate - _EPSILON))
        return AdmissionDecision(
            admitted=False, predicted_ttft_s=predicted, retry_after_s=retry_after
        )
