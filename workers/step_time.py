"""Decode step time as a function of batch size and context, learnt online: the TPOT cap.

A decode step reads the weights once (a constant), does some work per sequence, and reads
every running sequence's KV cache (proportional to their total context), so

    step_s = a + b * n + c * context_tokens

with ``n`` the running sequences and ``context_tokens`` their prompt plus produced tokens. On
a GPU the constant dominates and the context term grows with long prompts; on a CPU the
per-sequence term does. `StepTimeModel` fits the three coefficients (all non-negative) by
least squares over a window of recent steps, after discarding outliers (a step that also ran
a prefill chunk, a pause of the worker's own event loop) by their distance from the fit in
median absolute deviations. `StepTimeModel.cap` is the largest batch whose predicted step
stays within a TPOT SLO: the worker starts no job beyond it, so decode never exceeds the SLO
because too many sequences run. Before the first fit it starts low and grows (`START_CAP`).

A decode-only step is not all a running sequence waits for: while the slots are full, every
sequence that ends makes room for one that starts, and that one's prefill runs in steps the
others share. Amortised over a sequence's life, each running sequence brings its successor's
prefill, ``prefill_s / output_tokens`` seconds per token, to every neighbour's token gap, so a
full batch of ``n`` sequences makes tokens every

    tpot_s = a + (b + c * context_per_seq + prefill_s_per_seq) * n

seconds. The term is additive, from what a job costs (its prompt at the engine's prefill rate,
its output tokens), not a measured stretch of token gaps: a stretch measured under the cap
moves with the cap, and dividing by it fed back until the cap fell to 1.

Pure logic, no I/O: `workers.load.LoadTracker` feeds it and asks it for the cap.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass

from llmq.linear import solve

START_CAP = 4
"""Where the cap starts before the first fit (a slow start). A worker that has timed no steps
cannot know its batch limit: without a start, a new CPU worker at 2 requests/s ran its first
37 requests 12-16 together at a TPOT of 115-200 ms against a 100 ms SLO, until 32 steps gave
the first fit and a cap of 2. Until that fit, the cap is one more than the largest batch
whose decode step was timed within the SLO's margin, so a full batch grows it one sequence at
a time and the window gets the different batch sizes a fit needs (a fixed start cap that the
batch always fills would give steps of a single size, and never a fit)."""
SAFETY_MARGIN = 0.9
"""The cap keeps the predicted step time at or under this fraction of the SLO: the 10% left
absorbs what the fit cannot see (jitter between steps, the running jobs' contexts growing
until the next refit, the worker's own per-token work)."""
WINDOW = 512
"""Recent samples (about one per engine step) the fit uses: some 10-25 s of decoding. Older
steps are forgotten, so a fit follows a change of workload."""
REFIT_EVERY = 32
"""New samples after which the next question refits (a fit costs about a millisecond)."""
MIN_SAMPLES = 32
"""Fewer samples than this (after discarding outliers): no fit."""
MIN_DISTINCT_N = 3
"""A window with fewer different batch sizes than this cannot tell the per-sequence slope
from noise: no fit."""
OUTLIER_MADS = 3.0
"""A sample further from the fit than this many (normal-scaled) median absolute deviations
of the residuals is dropped and the fit redone."""
OUTLIER_FLOOR = 0.02
"""... but never closer than this fraction of the median step time (exact data has a MAD of
zero, and rounding must not count as an outlier)."""
TRIM_ROUNDS = 2
"""Rounds of dropping outliers and refitting."""
_MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution is 0.6745 sigma
_SUBSETS = tuple(
    cols for size in (3, 2, 1) for cols in itertools.combinations(range(3), size)
)  # every set of free coefficients, for the exact non-negative solution


@dataclass(frozen=True)
class StepTimeFit:
    """One fit: ``step_s = a + b * n + c * context_tokens``, all coefficients >= 0."""

    a: float
    """Seconds every step costs (weight reads, launch overhead)."""
    b: float
    """Seconds each running sequence adds."""
    c: float
    """Seconds each token of context (KV cache read) adds."""
    samples: int
    """Samples the fit kept (outliers dropped)."""
    context_per_seq: float
    """Mean context tokens per running sequence over those samples: the context a cap is
    usually asked for."""

    def predict(self, n: int, context_tokens: float) -> float:
        """Predicted seconds of a decode step of ``n`` sequences holding ``context_tokens``."""
        return self.a + self.b * n + self.c * context_tokens


class StepTimeModel:
    """Decode step time learnt from samples ``(n, context_tokens, step_s)``; see the module.

    `add` is cheap (an append); fitting happens on the next question (`fit`, `predict`,
    `cap`) once `refit_every` samples arrived since the last fit. A window that cannot support
    a fit (too few samples, too few batch sizes) keeps the previous fit: the hardware did not
    change, only the workload stopped varying. Before the first fit there is no information,
    and no cap.
    """

    def __init__(
        self,
        *,
        window: int = WINDOW,
        refit_every: int = REFIT_EVERY,
        min_samples: int = MIN_SAMPLES,
        min_distinct_n: int = MIN_DISTINCT_N,
        margin: float = SAFETY_MARGIN,
    ) -> None:
        if window < min_samples or min_samples < 3 or min_distinct_n < 2 or refit_every < 1:
            raise ValueError("need window >= min_samples >= 3, min_distinct_n >= 2")
        if not 0.0 < margin <= 1.0:
            raise ValueError("margin must be within (0, 1]")
        self._samples: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._refit_every = refit_every
        self._min_samples = min_samples
        self._min_distinct_n = min_distinct_n
        self.margin = margin
        self._since_fit = 0
        self._fit: StepTimeFit | None = None
        self._fastest: dict[int, float] = {}
        """The shortest step timed for each batch size: what the cap grows by before a fit."""

    def add(self, n: int, context_tokens: int, step_s: float) -> None:
        """One decode step of ``n`` sequences holding ``context_tokens`` that took ``step_s``
        seconds. Meaningless samples (no sequence, a non-positive or infinite time) are
        ignored."""
        if n < 1 or context_tokens < 0 or not 0.0 < step_s < math.inf:
            return
        self._samples.append((n, context_tokens, step_s))
        self._since_fit += 1
        if self._fit is None:
            self._fastest[n] = min(step_s, self._fastest.get(n, math.inf))

    @property
    def sample_count(self) -> int:
        """Samples in the window."""
        return len(self._samples)

    @property
    def current(self) -> StepTimeFit | None:
        """The fit, refitted first when enough new samples arrived; None: no information."""
        if self._since_fit >= self._refit_every:
            self.fit()
        return self._fit

    def fit(self) -> StepTimeFit | None:
        """Refit on the window now (keeping the previous fit if the window supports none)."""
        self._since_fit = 0
        fitted = _robust_fit(list(self._samples), self._min_samples, self._min_distinct_n)
        if fitted is not None:
            self._fit = fitted
        return self._fit

    def predict(self, n: int, context_tokens: float) -> float | None:
        """Predicted decode step seconds; None before the first fit."""
        fit = self.current
        return None if fit is None else fit.predict(n, context_tokens)

    def cap(
        self,
        tpot_slo_s: float,
        context_per_seq: float,
        max_num_seqs: int,
        prefill_s_per_seq: float = 0.0,
    ) -> int:
        """The most sequences (each holding ``context_per_seq`` tokens and bringing
        ``prefill_s_per_seq`` seconds of its successor's prefill to each step, see the module)
        whose predicted token gap stays within ``margin`` x ``tpot_slo_s``: at most
        ``max_num_seqs``, at least 1 (even when a single sequence is predicted over the SLO:
        nothing but running fewer helps, and none would be worse). Before the first fit, the
        slow start: one more than the largest batch timed within ``margin`` x ``tpot_slo_s``,
        at least `START_CAP`, at most ``max_num_seqs``."""
        if tpot_slo_s <= 0:
            raise ValueError("tpot_slo_s must be positive")
        fit = self.current
        if fit is None:
            budget_s = self.margin * tpot_slo_s
            timed = (n for n, step_s in self._fastest.items() if step_s <= budget_s)
            return min(max_num_seqs, max(START_CAP, max(timed, default=0) + 1))
        if max_num_seqs <= 1:
            return max_num_seqs
        budget = self.margin * tpot_slo_s - fit.a
        per_seq = fit.b + fit.c * max(context_per_seq, 0.0) + max(prefill_s_per_seq, 0.0)
        if per_seq <= 0.0:
            return max_num_seqs if budget >= 0 else 1
        most = math.floor(budget / per_seq + 1e-9)
        return max(1, min(max_num_seqs, most))


def _robust_fit(
    samples: list[tuple[int, int, float]], min_samples: int, min_distinct_n: int
) -> StepTimeFit | None:
    """Non-negative least squares, then up to `TRIM_ROUNDS` of dropping outliers and
    refitting; None when the samples (before or after trimming) cannot support a fit."""
    kept = samples
    coef: tuple[float, float, float] | None = None
    for round_ in range(TRIM_ROUNDS + 1):
        if len(kept) < min_samples or len({n for n, _, _ in kept}) < min_distinct_n:
            return None
        coef = _nnls(kept)
        if coef is None or round_ == TRIM_ROUNDS:
            break
        a, b, c = coef
        residuals = [s - (a + b * n + c * ctx) for n, ctx, s in kept]
        centre = statistics.median(residuals)
        mad = statistics.median(abs(r - centre) for r in residuals)
        floor = OUTLIER_FLOOR * statistics.median(s for _, _, s in kept)
        limit = max(OUTLIER_MADS * _MAD_TO_SIGMA * mad, floor)
        trimmed = [x for x, r in zip(kept, residuals, strict=True) if abs(r - centre) <= limit]
        if len(trimmed) == len(kept):
            break
        kept = trimmed
    if coef is None:
        return None
    per_seq = statistics.fmean(ctx / n for n, ctx, _ in kept)
    return StepTimeFit(*coef, samples=len(kept), context_per_seq=per_seq)


def _nnls(samples: list[tuple[int, int, float]]) -> tuple[float, float, float] | None:
    """Least squares of ``step_s`` on ``(1, n, context)`` with every coefficient >= 0.

    With three coefficients the exact answer is the best (least squared error) of the
    unconstrained solutions over every subset of free coefficients (the rest held at 0) that
    come out non-negative. Columns are scaled to their largest value first, so the normal
    equations stay well conditioned; a subset whose columns are collinear (every sequence
    holding the same context) is skipped, and a smaller one answers.
    """
    scale = [
        1.0,
        float(max(n for n, _, _ in samples)),
        float(max(ctx for _, ctx, _ in samples)) or 1.0,
    ]
    gram = [[0.0] * 3 for _ in range(3)]
    xty = [0.0] * 3
    yty = 0.0
    for n, ctx, s in samples:
        x = (1.0, n / scale[1], ctx / scale[2])
        for i in range(3):
            xty[i] += x[i] * s
            for j in range(i, 3):
                gram[i][j] += x[i] * x[j]
        yty += s * s
    for i in range(3):
        for j in range(i):
            gram[i][j] = gram[j][i]
    best: tuple[float, list[float]] | None = None
    for cols in _SUBSETS:
        sol = solve([[gram[i][j] for j in cols] for i in cols], [xty[i] for i in cols])
        if sol is None or any(v < 0.0 for v in sol):
            continue
        coef = [0.0, 0.0, 0.0]
        for i, v in zip(cols, sol, strict=True):
            coef[i] = v
        fitted = sum(coef[i] * xty[i] for i in range(3))  # b'X'y = b'X'Xb at the optimum
        sse = yty - fitted
        if best is None or sse < best[0] - 1e-15 * yty:
            best = (sse, coef)
    if best is None:
        return None
    coef = best[1]
    return (coef[0] / scale[0], coef[1] / scale[1], coef[2] / scale[2])
