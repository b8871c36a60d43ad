"""How actual TTFTs follow the predicted waits on a replica, learnt per pool: an
exponentially weighted least-squares fit of

    actual TTFT = overhead + own factor x own prefill + slot factor x slot wait
                  + prefill factor x prefill ahead + decode cost x sequences running

The parameters come out of one fit, so the overhead (the hop, the step that makes the first
token) is learnt from every request, not only from those that had nothing ahead of them (on a
busy pool few have).

- The own prefill (the prompt at the replica's measured rate) has a factor because that rate
  is itself an estimate that moves: a fallback until the replica has prefilled anything, and
  on a CPU engine a ratio that folds each step's fixed cost into short prompts' tokens.
  Without it, what a changed rate adds would be counted twice, once in the prefill and once
  in the overhead learnt before.
- The two waits get factors of their own because they behave differently: a wait for a slot
  is served whole, while prompts queued ahead are mostly prefilled in the same engine steps
  as the request's own (chunked prefill batches them, and a step that reads the weights
  anyway costs little more for a few hundred prompt tokens), so their factor is usually far
  below 1.
- The last term is the decode load the request arrives into: its prefill shares engine steps
  with every running sequence's decode, and the step ends only when they all have their next
  token. On a GPU a step barely grows with the batch and the cost learnt is near 0; on a CPU
  engine, where each sequence adds to every step, it is what a request arriving among eight
  decoding streams waits for while its slot wait and the prompts ahead are both 0.

Weak priors hold the three factors near 1 and the decode cost at 0 while what they multiply
barely varies (then the overhead carries it). Each request weighs 1 / max(its actual TTFT, its
raw prediction)^2, the raw prediction being the default overhead plus the request's own prefill
and both waits at a factor of 1 (known before the outcome, not learnt). So the fit minimises
relative errors (how prediction error is judged), each relative to the larger of the two, so no
single request dominates it from either side: a few long unforeseen waits cannot drag the short
TTFTs' overhead up (their actual is the scale), and a request that started at once although the
heartbeat said a slot was a second away (a job ended early, a slot freed between heartbeats)
cannot drag the slot factor down for all the others (its raw wait is the scale). Weighed by the
actual alone, that one request weighed 60-100 times as much as each of the dozens whose
one-second slot waits came true: on the CPU engine the slot factor sat at its floor and the
requests that waited a second for a slot were predicted at a third of it.

The spread of single requests around the fit (the moving root mean square of log(actual /
predicted), each clamped to a factor of e^2, from the second request on: the first was
predicted from defaults, not the fit) is what admission's margin for a high percentile uses:
relative, because a wait's error grows with the wait (a flooding team's long waits must not
widen the margin of a steady team's short ones), in logs and clamped, so one wild
over-prediction cannot blow the margin up. Each request weighs the smaller of its predicted
and actual TTFT, squared, in it: the margin decides only for predictions near the SLO, and a
short TTFT's relative error, where one engine step is a third of it, says little about a long
one's (nor does a long prediction that started at once: both must be long). Weighed alike, on
the CPU engine 0.2 s TTFTs that scattered by +-50% held the margin near 1.8x, and requests
predicted 0.5-0.8 s, which all met a 1 s SLO when admitted, were refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmq.linear import solve

MAX_LOG_ERROR = 2.0
"""A single request's log(actual / predicted) counts at most this far from 0 in the spread."""

MIN_ACTUAL_S = 0.005
"""Actual TTFTs below this weigh as much as this one (a guard against tiny denominators)."""

MIN_OWN_FACTOR = 0.1
"""The least factor on a request's own prefill: a rate estimate that jumped may make the
prefill look nearly free for a while, never entirely (long prompts must still cost more)."""

MIN_SLOT_FACTOR = 0.25
"""The least factor on a slot wait (the heartbeat's slot ends may be too late, never by 4x
for long)."""

MAX_DECODE_COST_S = 1.0
"""The most the decode term may add per running sequence (a bound on a wild fit)."""

_TERMS = 4  # own prefill, slot wait, prefill ahead, running sequences


@dataclass(frozen=True)
class WaitLine:
    """The learnt parameters of one pool."""

    overhead_s: float
    slot_factor: float
    prefill_factor: float
    decode_s: float = 0.0
    """Seconds added per sequence running on the replica when the request arrives."""
    own_factor: float = 1.0
    """What the request's own prefill, at the replica's measured rate, is multiplied by."""

    def ttft_s(
        self, own_prefill_s: float, slot_wait_s: float, prefill_ahead_s: float, running: int = 0
    ) -> float:
        """The predicted TTFT."""
        return (
            self.overhead_s
            + self.own_factor * own_prefill_s
            + self.slot_factor * slot_wait_s
            + self.prefill_factor * prefill_ahead_s
            + self.decode_s * running
        )


@dataclass(slots=True)
class _Sums:
    """Exponentially weighted sums: weight, the terms' and the TTFT's first and second
    moments, and the spread's squared log errors."""

    weight: float = 0.0
    x: list[float] = field(default_factory=lambda: [0.0] * _TERMS)
    y: float = 0.0
    xx: list[list[float]] = field(default_factory=lambda: [[0.0] * _TERMS for _ in range(_TERMS)])
    xy: list[float] = field(default_factory=lambda: [0.0] * _TERMS)
    count: float = 0.0
    """The spread's weight: the sum of its samples' weights (see `WaitFit.spread_log`)."""
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
        m = [v / w for v in s.x]
        my = s.y / w
        # Ridge normal equations on centred data, pulled towards factors of 1 (own prefill
        # and the waits) and a decode cost of 0.
        priors = (self.prior_s2, self.prior_s2, self.prior_s2, self.running_prior)
        targets = (1.0, 1.0, 1.0, 0.0)
        a = [
            [s.xx[i][j] / w - m[i] * m[j] + (priors[i] if i == j else 0.0) for j in range(_TERMS)]
            for i in range(_TERMS)
        ]
        b = [s.xy[i] / w - m[i] * my + priors[i] * targets[i] for i in range(_TERMS)]
        solved = solve(a, b)
        if solved is None:  # the priors keep it positive definite; a guard all the same
            return WaitLine(default_overhead_s, 1.0, 1.0)
        own, slot, prefill, decode = solved
        own = min(max(own, MIN_OWN_FACTOR), self.max_factor)
        slot = min(max(slot, MIN_SLOT_FACTOR), self.max_factor)
        prefill = min(max(prefill, 0.0), self.max_factor)
        decode = min(max(decode, 0.0), MAX_DECODE_COST_S)
        coef = (own, slot, prefill, decode)
        overhead = max(my - sum(c * mi for c, mi in zip(coef, m, strict=True)), 0.0)
        return WaitLine(overhead, slot, prefill, decode, own)

    def spread_log(self, pool: str) -> float:
        """Root mean square of recent log(actual / predicted), each within +-2 and weighed by
        the smaller of the two, squared (0 until measured)."""
        s = self._sums.get(pool)
        return math.sqrt(s.squared_error / s.count) if s and s.count else 0.0

    def observe(
        self,
        pool: str,
        *,
        own_prefill_s: float,
        slot_wait_s: float,
        prefill_ahead_s: float,
        actual_s: float,
        default_overhead_s: float,
        running: int = 0,
    ) -> None:
        """One request: its own prefill and predicted waits, the sequences running where it
        was sent, and its actual TTFT."""
        predicted = self.line(pool, default_overhead_s).ttft_s(
            own_prefill_s, slot_wait_s, prefill_ahead_s, running
        )
        fitted = pool in self._sums  # else the prediction was the defaults, not a fit
        s = self._sums.setdefault(pool, _Sums())
        k = self.decay
        raw_s = default_overhead_s + own_prefill_s + slot_wait_s + prefill_ahead_s
        v = 1 / max(actual_s, raw_s, MIN_ACTUAL_S) ** 2
        x = (own_prefill_s, slot_wait_s, prefill_ahead_s, float(running))
        s.weight = s.weight * k + v
        s.y = s.y * k + v * actual_s
        for i in range(_TERMS):
            s.x[i] = s.x[i] * k + v * x[i]
            s.xy[i] = s.xy[i] * k + v * x[i] * actual_s
            for j in range(_TERMS):
                s.xx[i][j] = s.xx[i][j] * k + v * x[i] * x[j]
        if not fitted:
            # The defaults' miss says nothing about the fit's spread; counted, it would hold
            # the margin at its widest for dozens of requests, and a margin that refuses
            # most requests leaves few to learn a narrower one from.
            return
        scale = max(min(predicted, actual_s), MIN_ACTUAL_S) ** 2  # see the module docstring
        s.count = s.count * k + scale
        ratio = max(actual_s, MIN_ACTUAL_S) / max(predicted, MIN_ACTUAL_S)
        log_error = min(max(math.log(ratio), -MAX_LOG_ERROR), MAX_LOG_ERROR)
        s.squared_error = s.squared_error * k + scale * log_error * log_error
