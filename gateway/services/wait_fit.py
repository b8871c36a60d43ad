"""How actual TTFTs follow the predicted waits on a replica, learnt per pool: an
exponentially weighted least-squares fit of

    actual TTFT - own prefill = overhead + slot factor x slot wait + prefill factor x prefill ahead
                                + decode cost x sequences running


The parameters come out of one fit, so the overhead (the hop, the step that makes the first
token) is learnt from every request, not only from those that had nothing ahead of them (on a
busy pool few have). The two waits get factors of their own because they behave differently:
a wait for a slot is served whole, while prompts queued ahead are mostly prefilled in the same
engine steps as the request's own (chunked prefill batches them, and a step that reads the
weights anyway costs little more for a few hundred prompt tokens), so their factor is
usually far below 1. A weak prior holds both factors near 1 while the waits seen barely vary.
The last term is the decode load the request arrives into: its prefill shares engine steps
with every running sequence's decode, and the step ends only when they all have their next
token. On a GPU a step barely grows with the batch and the cost learnt is near 0; on a CPU
engine, where each sequence adds to every step, it is what a request arriving among eight
decoding streams waits for while its slot wait and the prompts ahead are both 0. A weak
prior holds it at 0 while the running count barely varies (then the overhead carries it).
Each request weighs 1 / its actual TTFT squared, so the fit minimises relative errors
(how prediction error is judged) and a few long waits cannot drag the short TTFTs' overhead
up. The spread of single requests around the fit (the moving root mean square of
log(actual / predicted), each clamped to a factor of e^2) is what admission's margin for a
high percentile uses: relative, because a wait's error grows with the wait (a flooding
team's long waits must not widen the margin of a steady team's short ones), in logs and
clamped, so one wild over-prediction cannot blow the margin up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_LOG_ERROR = 2.0
"""A single request's log(actual / predicted) counts at most this far from 0 in the spread."""

MIN_ACTUAL_S = 0.005
"""Actual TTFTs below this weigh as much as this one (a guard against tiny denominators)."""

MAX_DECODE_COST_S = 1.0
"""The most the decode term may add per running sequence (a bound on a wild fit)."""


@dataclass(frozen=True)
class WaitLine:
    """The learnt parameters of one pool."""

    overhead_s: float
    slot_factor: float
    prefill_factor: float
    decode_s: float = 0.0
    """Seconds added per sequence running on the replica when the request arrives."""

    def beyond_prefill_s(
        self, slot_wait_s: float, prefill_ahead_s: float, running: int = 0
    ) -> float:
        """The predicted TTFT less the request's own prefill."""
        return (
            self.overhead_s
            + self.slot_factor * slot_wait_s
            + self.prefill_factor * prefill_ahead_s
            + self.decode_s * running
        )


@dataclass(slots=True)
class _Sums:
    """Exponentially weighted sums: weight, means' numerators and second moments."""

    weight: float = 0.0
    x1: float = 0.0
    x2: float = 0.0
    y: float = 0.0
    x1x1: float = 0.0
    x2x2: float = 0.0
    x1x2: float = 0.0
    x1y: float = 0.0
    x2y: float = 0.0
    x3: float = 0.0
    x3x3: float = 0.0
    x1x3: float = 0.0
    x2x3: float = 0.0
    x3y: float = 0.0
    count: float = 0.0
    squared_error: float = 0.0


class WaitFit:
    """Per pool, the fit in the module docstring; samples weigh ``decay`` less per later one."""

    def __init__(
        self,
        *,
        decay: float = 0.97,
        prior_s2: float = 2.5e-5,
        running_prior: float = 0.01,
        max_factor: float = 8.0,
    ) -> None:
        if not 0 < decay < 1 or prior_s2 <= 0 or running_prior <= 0 or max_factor < 1:
            raise ValueError("decay lies in (0, 1), the priors are positive, max_factor >= 1")
        self.decay = decay
        self.prior_s2 = prior_s2
        """How strongly the factors are held at 1: a variance of waits, in s^2."""
        self.running_prior = running_prior
        """How strongly the decode cost is held at 0: a variance of running counts."""
        self.max_factor = max_factor
        self._sums: dict[str, _Sums] = {}

    def line(self, pool: str, default_overhead_s: float) -> WaitLine:
        """The pool's parameters: ``default_overhead_s`` and factors of 1 until a sample."""
        s = self._sums.get(pool)
        if s is None or s.weight <= 0:
            return WaitLine(default_overhead_s, 1.0, 1.0)
        w = s.weight
        m1, m2, m3, my = s.x1 / w, s.x2 / w, s.x3 / w, s.y / w
        prior = self.prior_s2
        # Ridge normal equations on centred data, pulled towards factors of 1 (the waits)
        # and a decode cost of 0.
        a = (
            (s.x1x1 / w - m1 * m1 + prior, s.x1x2 / w - m1 * m2, s.x1x3 / w - m1 * m3),
            (s.x1x2 / w - m1 * m2, s.x2x2 / w - m2 * m2 + prior, s.x2x3 / w - m2 * m3),
            (s.x1x3 / w - m1 * m3, s.x2x3 / w - m2 * m3, s.x3x3 / w - m3 * m3 + self.running_prior),
        )
        b = (s.x1y / w - m1 * my + prior, s.x2y / w - m2 * my + prior, s.x3y / w - m3 * my)
        slot, prefill, decode = _solve3(a, b)
        slot = min(max(slot, 0.25), self.max_factor)
        prefill = min(max(prefill, 0.0), self.max_factor)
        decode = min(max(decode, 0.0), MAX_DECODE_COST_S)
        overhead = max(my - slot * m1 - prefill * m2 - decode * m3, 0.0)
        return WaitLine(overhead, slot, prefill, decode)

    def spread_log(self, pool: str) -> float:
        """Root mean square of recent log(actual / predicted), each within +-2 (0 until
        measured)."""
        s = self._sums.get(pool)
        return math.sqrt(s.squared_error / s.count) if s and s.count else 0.0

    def observe(
        self,
        pool: str,
        *,
        slot_wait_s: float,
        prefill_ahead_s: float,
        beyond_prefill_s: float,
        actual_s: float,
        default_overhead_s: float,
        running: int = 0,
    ) -> None:
        """One request: its predicted waits, the sequences running where it was sent, its
        actual TTFT, and that less its own prefill."""
        predicted = self.line(pool, default_overhead_s).beyond_prefill_s(
            slot_wait_s, prefill_ahead_s, running
        )
        s = self._sums.setdefault(pool, _Sums())
        k = self.decay
        v = 1 / max(actual_s, MIN_ACTUAL_S) ** 2
        x1, x2, x3, y = slot_wait_s, prefill_ahead_s, float(running), beyond_prefill_s
        s.weight = s.weight * k + v
        s.x1, s.x2, s.y = s.x1 * k + v * x1, s.x2 * k + v * x2, s.y * k + v * y
        s.x1x1 = s.x1x1 * k + v * x1 * x1
        s.x2x2 = s.x2x2 * k + v * x2 * x2
        s.x1x2 = s.x1x2 * k + v * x1 * x2
        s.x1y, s.x2y = s.x1y * k + v * x1 * y, s.x2y * k + v * x2 * y
        s.x3, s.x3x3, s.x3y = s.x3 * k + v * x3, s.x3x3 * k + v * x3 * x3, s.x3y * k + v * x3 * y
        s.x1x3, s.x2x3 = s.x1x3 * k + v * x1 * x3, s.x2x3 * k + v * x2 * x3
        s.count = s.count * k + 1
        prefill_s = actual_s - beyond_prefill_s
        ratio = max(actual_s, MIN_ACTUAL_S) / max(prefill_s + predicted, MIN_ACTUAL_S)
        log_error = min(max(math.log(ratio), -MAX_LOG_ERROR), MAX_LOG_ERROR)
        s.squared_error = s.squared_error * k + log_error * log_error


def _solve3(a: Sequence[Sequence[float]], b: Sequence[float]) -> tuple[float, float, float]:
    """The solution of the 3x3 system a x = b by Cramer's rule (the ridge priors keep a
    positive definite, so its determinant is never 0)."""

    def det(m: Sequence[Sequence[float]]) -> float:
        return (
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        )

    whole = det(a)
    x = [det([[b[i] if k == j else a[i][k] for k in range(3)] for i in range(3)]) / whole
         for j in range(3)]  # fmt: skip
    return x[0], x[1], x[2]
