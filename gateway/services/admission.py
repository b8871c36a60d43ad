"""TTFT-based admission: refuse (429 + Retry-After) before any stream opens when the SLO
cannot be met.

A request waits for two things before its first token: the prefill of what is queued ahead of
it (and its own), and, when every sequence slot of the pool is taken, a slot. Both are counted
in one unit, prefill-token equivalents, in a per-pool backlog counter:

- the gateway adds each interactive job's prompt tokens plus its share of slot time,
  ``slot_tokens`` = (mean slot-holding time of a job / the pool's slots) x the pool's prefill
  rate, when it produces the job (`InferenceJob.queue_units`);
- the worker removes the prompt tokens when it starts the job and the slot share when the job
  ends.

So the counter holds the prompts still to prefill and one slot share per queued or running job.
The pool's slots take that many jobs without a wait, so they are credited:

    predicted TTFT = overhead + own prompt / rate
                     + factor x max(ahead + slot_tokens - slots x slot_tokens, 0) / rate

where `ahead` is what fair queuing serves before the request (the team's own units, and at
most as much of each other team's), the rate the sum of ready replicas' prefill rates, and
slots and slot times come from their heartbeats. The overhead (the hop, the engine step that
makes the first token) and the factor on the wait are learnt per pool from actual TTFTs
(`TtftCalibration`). With no slot times measured yet, slot_tokens is 0 and only prefill counts.
Batch work is never refused here: it waits in its own topic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.services.replica_wait import ReplicaWait
from gateway.services.wait_fit import WaitFit
from schemas.chat import Tier
from schemas.heartbeat import ReplicaHeartbeat

_EPSILON = 1e-9

OUTLIER_RATIO = 4.0
"""One request counts at most this many times the current estimate (of the overhead, or of
its wait's error): a first token delayed by something the model cannot see (a grammar's
first compilation takes the CPU engine 18 s) must not poison the pool's calibration for the
dozens of requests a moving average needs to forget it. A lasting change still shows: each
request can move the estimate by up to 1 + weight x (ratio - 1)."""

MIN_ESTIMATE_S = 0.01
"""The least estimate the outlier bound is taken relative to (an overhead learnt near 0 must
still be able to grow)."""

BACKLOG_GATE_SLACK = 2.0
"""The pool's backlog gate (before routing) admits up to this many times the raw wait that
the SLO leaves on the pool's averages. The gate is what concurrent admissions cannot overshoot
and what applies fair queuing between teams; whether a request meets the SLO is judged after
routing, on its replica's slots (`gateway.services.replica_admission`), which know when a slot
frees. On averages alone, a replica capped at 2 slots by the TPOT SLO, with jobs of 2.2 s, had
every request that found both slots taken predicted to wait 1.1 s and refused, so a slot
stood idle until the next arrival: on the CPU stack llmq admitted 0.5 requests/s of an engine
that could serve 0.9."""

MAX_REPLICA_MARGIN = 2.0
"""A replica-basis prediction is judged at its percentile, at most twice the prediction: a
fit still wild (few requests, an engine whose times scatter, like a CPU engine's) must not
refuse requests predicted well within the SLO."""


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
    slot_s: float = 0.0
    """Mean slot-holding time of a job / total slots: how often, on average, a slot frees
    while all are busy (0 until a job has finished)."""

    def slot_tokens(self, prefill_tokens_per_s: float) -> int:
        """A job's share of slot time in prefill-token equivalents."""
        return math.ceil(self.slot_s * prefill_tokens_per_s - _EPSILON)


def pool_slots(replicas: Sequence[ReplicaHeartbeat]) -> PoolSlots:
    """Slots and slot time over the ready, healthy replicas that report them."""
    ready = [r for r in replicas if r.state == "ready" and r.healthy and r.max_num_seqs > 0]
    total = sum(r.max_num_seqs for r in ready)
    timed = [r.mean_job_s for r in ready if r.mean_job_s > 0]
    slot_s = sum(timed) / len(timed) / total if timed and total else 0.0
    return PoolSlots(total, slot_s)


def pool_prefill_rate(replicas: Sequence[ReplicaHeartbeat]) -> float:
    """Sum of the measured prefill rates (tokens/s) of the ready, healthy replicas."""
    return sum(
        r.prefill_tokens_per_s
        for r in replicas
        if r.state == "ready" and r.healthy and r.prefill_tokens_per_s > 0
    )


@dataclass(frozen=True)
class TtftPrediction:
    """One request's predicted time to first token and its parts (what calibration learns
    from when the actual one arrives)."""

    ttft_s: float
    """The prediction: the pool's overhead + `prefill_s` + its calibration factor x `wait_s`."""
    wait_s: float
    """Raw seconds of work served before this request: the prefill of what is queued ahead
    and the wait for a slot (0: nothing ahead and a slot free for it)."""
    prefill_s: float
    """This request's own prefill at the pool's rate."""
    basis: Literal["pool", "replica"] = "pool"
    """What it was made from: the pool's backlog (what admission's atomic limit holds), or
    the slots of the replica the request was routed to (`gateway.services.replica_wait`);
    each is calibrated on its own."""
    slot_wait_s: float = 0.0
    """With the replica basis: the part of `wait_s` spent waiting for a slot (the rest is
    the prefill of prompts ahead)."""
    fit_key: str = ""
    """With the replica basis: what its calibration is learnt under (pool and team)."""
    running: int = 0
    """With the replica basis: the sequences running on the replica as it was judged."""
    pool_prediction: TtftPrediction | None = None
    """With the replica basis: the pool's prediction for the same request (still learnt
    from, as admission's queue limit uses it)."""


class TtftPredictor:
    """The raw model: what is ahead of a request and its own prefill, at the pool's rate."""

    def __init__(
        self, *, overhead_s: float = 0.05, fallback_prefill_tokens_per_s: float = 2_000.0
    ) -> None:
        if overhead_s < 0 or fallback_prefill_tokens_per_s <= 0:
            raise ValueError("overhead must be >= 0 and the fallback rate > 0")
        self.overhead_s = overhead_s
        """Where the learnt overhead starts (the hop, the step that makes the first token)."""
        self.fallback_prefill_tokens_per_s = fallback_prefill_tokens_per_s

    def rate(self, prefill_tokens_per_s: float) -> float:
        """The measured rate, or the fallback while nothing has been measured (0)."""
        if prefill_tokens_per_s > 0:
            return prefill_tokens_per_s
        return self.fallback_prefill_tokens_per_s

    def parts(
        self,
        *,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        slot_tokens: int = 0,
        slots: int = 0,
    ) -> tuple[float, float]:
        """(wait, own prefill) in raw seconds: the prefill-token equivalents served before the
        request (see the module docstring), and its own prompt, at the pool's rate."""
        rate = self.rate(prefill_tokens_per_s)
        ahead = max(queued_tokens, 0) + slot_tokens - slots * slot_tokens
        return max(ahead, 0) / rate, prompt_tokens / rate


class TtftCalibration:
    """Per pool, what the raw model leaves out, learnt from actual TTFTs (moving averages):

    - the overhead (the hop, the engine step that makes the first token), from requests that
      had nothing ahead of them: actual - own prefill;
    - a factor on the wait, from requests that waited: the moving sum of what they waited
      (actual - overhead - own prefill) over the moving sum of their predicted waits, and
      bounded. A ratio of sums, not an average of ratios: a request predicted to wait 10 ms
      that waited 80 ms (the engine step its prefill shared with eight decoding streams) says
      little about how long a 300 ms wait takes, yet as a ratio it counted as much as one,
      and on the CPU stack at 4-6 requests/s such requests drove the factor to its bound of
      8 and the backlog refused most of what the engine would have served in time;
    - how far single waits stray from that, in seconds (the moving average of the squared
      error), so admission can judge a high percentile of the TTFT instead of its typical value.

    Each sample is bounded relative to the current estimate (`OUTLIER_RATIO`), so one wild
    TTFT moves the estimates a step, not to the outlier.
    """

    def __init__(
        self,
        weight: float = 0.2,
        bounds: tuple[float, float] = (0.25, 8.0),
        factor_weight: float = 0.05,
    ) -> None:
        if not 0 < weight <= 1 or not 0 < factor_weight <= 1 or not 0 < bounds[0] <= 1 <= bounds[1]:
            raise ValueError("the weights lie in (0, 1] and the bounds around 1")
        self.weight = weight
        """What each request weighs in the overhead's and the spread's moving averages."""
        self.factor_weight = factor_weight
        """What each request that waited weighs in the factor's moving sums: longer-lived than
        the overhead, so that the few long waits, which carry the sums, are not forgotten
        between them."""
        self.bounds = bounds
        self._waited_s: dict[str, float] = {}
        """Per pool, the moving sum of what requests that waited waited beyond the overhead."""
        self._wait_s: dict[str, float] = {}
        """Per pool, the moving sum of their predicted waits."""
        self._overhead_s: dict[str, float] = {}
        self._variance: dict[str, float] = {}

    def factor(self, pool: str) -> float:
        """What the pool's raw waits are multiplied by (1 until a request has waited)."""
        wait_s = self._wait_s.get(pool, 0.0)
        if wait_s <= 0:
            return 1.0
        low, high = self.bounds
        return min(max(self._waited_s[pool] / wait_s, low), high)

    def spread_s(self, pool: str) -> float:
        """The standard deviation of actual - predicted wait, in seconds (0 until measured)."""
        return math.sqrt(self._variance.get(pool, 0.0))

    def overhead(self, pool: str, default_s: float) -> float:
        """The pool's learnt overhead (``default_s`` until a request had nothing ahead)."""
        return self._overhead_s.get(pool, default_s)

    def observe(
        self, pool: str, prediction: TtftPrediction, actual_s: float, default_overhead_s: float
    ) -> float:
        """Learn from one request's actual TTFT; return the pool's factor."""
        overhead = self.overhead(pool, default_overhead_s)
        beyond_overhead = actual_s - prediction.prefill_s
        if prediction.wait_s <= 0:
            bound = OUTLIER_RATIO * max(overhead, MIN_ESTIMATE_S)
            sample = min(max(beyond_overhead, 0.0), bound)
            self._overhead_s[pool] = overhead + self.weight * (sample - overhead)
        elif actual_s > 0:
            waited = max(beyond_overhead - overhead, 0.0)
            expected_s = self.factor(pool) * prediction.wait_s
            bound = OUTLIER_RATIO * max(expected_s, self.spread_s(pool), MIN_ESTIMATE_S)
            error_s = min(max(waited - expected_s, -bound), bound)
            variance = self._variance.get(pool, 0.0)
            self._variance[pool] = variance + self.weight * (error_s**2 - variance)
            # Each request counts at most OUTLIER_RATIO times the wait the factor expects.
            counted_s = min(waited, OUTLIER_RATIO * max(expected_s, MIN_ESTIMATE_S))
            w = self.factor_weight
            self._waited_s[pool] = (1 - w) * self._waited_s.get(pool, 0.0) + w * counted_s
            self._wait_s[pool] = (1 - w) * self._wait_s.get(pool, 0.0) + w * prediction.wait_s
        return self.factor(pool)


class AdmissionController:
    """Admit interactive requests whose predicted TTFT meets the pool's SLO. Pure logic.

    A prompt too long to meet the SLO even on an idle pool is judged against its idle-pool TTFT
    instead (it is admitted once nothing is queued ahead of it): no Retry-After could help it.
    """

    def __init__(
        self,
        predictor: TtftPredictor | None = None,
        *,
        default_slo_s: float = 1.0,
        quantile: float = 0.5,
    ) -> None:
        if default_slo_s <= 0:
            raise ValueError("the TTFT SLO must be positive")
        if not 0.5 <= quantile < 1:
            raise ValueError("the quantile lies in [0.5, 1)")
        self.predictor = predictor or TtftPredictor()
        self.default_slo_s = default_slo_s
        self.calibration = TtftCalibration()
        self.replica_fit = WaitFit()
        """What predictions made from the routed replica's slots learn (`predict_on_replica`)."""
        self.quantile = quantile
        """The percentile of a request's TTFT that admission holds to the SLO."""
        self.z = statistics.NormalDist().inv_cdf(quantile)
        """How many standard deviations of the wait's error admission allows for: a
        request is admitted when that percentile of its TTFT (not the typical one) meets
        the SLO."""

    def predict(
        self,
        *,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        pool: str = "",
        slots: PoolSlots = PoolSlots(),
    ) -> TtftPrediction:
        """The calibrated prediction for a request with `queued_tokens` ahead of it."""
        rate = self.predictor.rate(prefill_tokens_per_s)
        wait, prefill = self.predictor.parts(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            slot_tokens=slots.slot_tokens(rate),
            slots=slots.total,
        )
        ttft = self._overhead(pool) + prefill + self.calibration.factor(pool) * wait
        return TtftPrediction(ttft_s=ttft, wait_s=wait, prefill_s=prefill)

    def predict_on_replica(
        self,
        *,
        prompt_tokens: int,
        wait: ReplicaWait,
        prefill_tokens_per_s: float,
        pool: str,
        team: str = "",
        pool_prediction: TtftPrediction | None = None,
    ) -> TtftPrediction:
        """The calibrated prediction from the routed replica's raw waits (`replica_wait`),
        with the line learnt for the pool and `team` (workers treat teams differently: a
        flooding team waits far longer for a slot than its raw wait says, a steady one less)."""
        prefill = prompt_tokens / self.predictor.rate(prefill_tokens_per_s)
        fit_key = f"{pool}/{team}"
        line = self.replica_fit.line(fit_key, self._overhead(pool))
        return TtftPrediction(
            ttft_s=line.ttft_s(prefill, wait.slot_s, wait.prefill_ahead_s, wait.running),
            wait_s=wait.slot_s + wait.prefill_ahead_s,
            prefill_s=prefill,
            basis="replica",
            slot_wait_s=wait.slot_s,
            fit_key=fit_key,
            running=wait.running,
            pool_prediction=pool_prediction,
        )

    def observe(self, pool: str, prediction: TtftPrediction, actual_s: float) -> float:
        """Learn from one request's actual TTFT (each basis its own calibration); return the
        pool calibration's factor."""
        pool_prediction: TtftPrediction | None = prediction
        if prediction.basis == "replica":
            self.replica_fit.observe(
                prediction.fit_key,
                own_prefill_s=prediction.prefill_s,
                slot_wait_s=prediction.slot_wait_s,
                prefill_ahead_s=prediction.wait_s - prediction.slot_wait_s,
                actual_s=actual_s,
                default_overhead_s=self._overhead(pool),
                running=prediction.running,
            )
            pool_prediction = prediction.pool_prediction
        if pool_prediction is None:
            return self.calibration.factor(pool)
        return self.calibration.observe(pool, pool_prediction, actual_s, self.predictor.overhead_s)

    def job_units(
        self, *, prompt_tokens: int, prefill_tokens_per_s: float, slots: PoolSlots
    ) -> int:
        """What one interactive job adds to the backlog: its prompt and its slot share."""
        return prompt_tokens + slots.slot_tokens(self.predictor.rate(prefill_tokens_per_s))

    def queue_limit(
        self,
        *,
        prompt_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        pool: str = "",
        slots: PoolSlots = PoolSlots(),
        margin: bool = True,
        max_factor: float = math.inf,
        slack: float = 1.0,
    ) -> int:
        """The most queued units (this request's `job_units` included) that still meet the
        SLO (its admitted percentile, or without ``margin`` its typical value), with the
        calibration factor taken as at most `max_factor` and the wait allowed times `slack`.
        The backlog adapter applies it atomically, so concurrent admissions cannot
        overshoot."""
        rate = self.predictor.rate(prefill_tokens_per_s)
        prefill_s = prompt_tokens / rate
        wait_budget_s = slack * self._wait_budget_s(pool, prefill_s, slo_s, margin, max_factor)
        credit = slots.total * slots.slot_tokens(rate)
        return math.floor(wait_budget_s * rate + _EPSILON) + prompt_tokens + credit

    def decide(
        self,
        *,
        tier: Tier,
        prompt_tokens: int,
        queued_tokens: int,
        prefill_tokens_per_s: float,
        slo_s: float | None = None,
        pool: str = "",
        slots: PoolSlots = PoolSlots(),
    ) -> AdmissionDecision:
        """Admit, or refuse with the whole seconds until the backlog has drained enough."""
        prediction = self.predict(
            prompt_tokens=prompt_tokens,
            queued_tokens=queued_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            pool=pool,
            slots=slots,
        )
        predicted = prediction.ttft_s
        if tier == "batch":
            return AdmissionDecision(admitted=True, predicted_ttft_s=predicted)
        retry_after = self.retry_after(prediction, slo_s, pool)
        return AdmissionDecision(
            admitted=retry_after is None, predicted_ttft_s=predicted, retry_after_s=retry_after
        )

    def retry_after(self, prediction: TtftPrediction, slo_s: float | None, pool: str) -> int | None:
        """None when the admitted percentile of `prediction` meets the SLO (or nothing is
        ahead of it: a prompt too long for the SLO is admitted once nothing waits), else
        the whole seconds to wait before retrying. A replica-basis prediction is judged with
        its own fit's relative spread."""
        if prediction.basis == "pool":
            budget_s = self._wait_budget_s(pool, prediction.prefill_s, slo_s)
            excess_s = prediction.wait_s - budget_s
        else:
            slo = self.default_slo_s if slo_s is None else slo_s
            high_s = self.judged_s(prediction, pool)
            excess_s = high_s - slo if prediction.wait_s > 0 else 0.0
        return None if excess_s <= _EPSILON else max(1, math.ceil(excess_s - _EPSILON))

    def judged_s(self, prediction: TtftPrediction, pool: str) -> float:
        """The TTFT percentile that `retry_after` holds to the SLO: the prediction with the
        margin for its basis's spread (what a refusal's message reports beside it)."""
        if prediction.basis == "pool":
            margin_s = self.z * self.calibration.spread_s(pool)
            waited_s = self.calibration.factor(pool) * prediction.wait_s
            return self._overhead(pool) + prediction.prefill_s + margin_s + waited_s
        spread = self.replica_fit.spread_log(prediction.fit_key)
        return prediction.ttft_s * min(math.exp(self.z * spread), MAX_REPLICA_MARGIN)

    def _overhead(self, pool: str) -> float:
        return self.calibration.overhead(pool, self.predictor.overhead_s)

    def _wait_budget_s(
        self,
        pool: str,
        prefill_s: float,
        slo_s: float | None,
        margin: bool = True,
        max_factor: float = math.inf,
    ) -> float:
        """The raw wait that still meets the SLO: (SLO - overhead - own prefill - the margin
        for the admitted percentile) / factor (at most `max_factor`), never below 0 (a prompt
        too long for the SLO is admitted once nothing is ahead)."""
        slo = self.default_slo_s if slo_s is None else slo_s
        margin_s = self.z * self.calibration.spread_s(pool) if margin else 0.0
        left = slo - self._overhead(pool) - prefill_s - margin_s
        return max(left / min(self.calibration.factor(pool), max_factor), 0.0)
