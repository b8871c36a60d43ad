"""What this worker holds and how fast it prefills: the load it reports in heartbeats.

The gateway routes on `outstanding_tokens` (bounded load) and admits on the pool's summed
`prefill_tokens_per_s`; the pull loop picks preemption victims from `running_jobs()`.

With a TPOT SLO, the tracker also times decode steps (`workers.step_time`) and `seq_cap`
says how many sequences may run so that a step stays within it: the pull loop starts no job
beyond that, and the heartbeat reports it as the replica's slots.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from schemas.messages import InferenceJob
from workers.headroom import RunningJob
from workers.step_time import StepTimeModel

log = structlog.get_logger()

TOKEN_GAP_WEIGHT = 0.05
"""Weight of each new per-token gap in the decode step time's moving average."""

OUTPUT_QUANTILE = 0.9
"""A job is expected to produce this percentile of recent finished jobs' outputs, at most its
max_tokens (most stop at an end-of-sequence well before a default max_tokens)."""

SAMPLE_SPACING = 0.5
"""A step is sampled by the first job whose token it brings: a gap ending sooner than this
fraction of itself after the last sample belongs to a step already sampled."""


@dataclass(slots=True)
class LoadTotals:
    """Running totals since the worker started (what its `/metrics` counters report)."""

    jobs_started: int = 0
    prefilled_tokens: int = 0
    """Prompt tokens computed, counted at each job's first token."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache, counted at each job's first token."""
    generated_tokens: int = 0


@dataclass(slots=True)
class _Progress:
    job: InferenceJob
    started_at: float
    prompt_tokens: int
    first_token_at: float | None = None
    last_token_at: float = 0.0
    cached_tokens: int = 0
    produced: int = 0


class LoadTracker:
    """Per-job progress of the jobs this worker holds, a prefill-rate estimate and, with a
    ``tpot_slo_s``, the decode step time model behind `seq_cap`.

    Step timing: the gap between two consecutive `produced` calls of one job (after its first
    token; divided by the tokens of the later call) is one step's time, with ``n`` the jobs
    producing and ``context`` their prompt + produced tokens. One sample per step (the first
    job to report it); none from a gap in which a job was prefilling or got its first token
    (that step also ran a prefill chunk), nor from jobs with ``n`` > 1 choices (one call per
    choice and step). A job counts as one sequence, as it takes one slot.
    """

    def __init__(
        self,
        window: int = 64,
        *,
        tpot_slo_s: float | None = None,
        step_times: StepTimeModel | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_started: Callable[[InferenceJob], None] | None = None,
    ) -> None:
        if tpot_slo_s is not None and tpot_slo_s <= 0:
            raise ValueError("tpot_slo_s must be positive")
        self._clock = clock
        self._on_started = on_started
        """Told of every job as it starts (the worker's queue-time metric)."""
        self.totals = LoadTotals()
        self._jobs: dict[str, _Progress] = {}
        # (prefilled tokens, seconds to first token) of recent jobs: the rate is the ratio of
        # the sums, so long prompts (where the rate matters) weigh more than short ones.
        self._prefills: deque[tuple[int, float]] = deque(maxlen=window)
        self._durations: deque[float] = deque(maxlen=window)
        """Seconds recent finished jobs held a slot, start to finish."""
        self._outputs: deque[int] = deque(maxlen=window)
        """Tokens recent finished jobs produced."""
        self._computed: deque[int] = deque(maxlen=window)
        """Prompt tokens recent jobs prefilled (not served from the prefix cache)."""
        self._token_gap_s = 0.0
        """Moving average of the seconds between a running job's tokens (0: none timed)."""
        self._last_progress = clock()
        self.tpot_slo_s = tpot_slo_s
        self.step_times: StepTimeModel | None = None
        """Decode step times, learnt only with a TPOT SLO (else nothing is sampled)."""
        if tpot_slo_s is not None:
            self.step_times = step_times or StepTimeModel()
        self._producing = 0
        """Jobs past their first token."""
        self._context = 0
        """Their prompt + produced tokens."""
        self._prefilling = 0
        """Jobs started without a first token yet."""
        self._last_first_token_at = -float("inf")
        self._last_sample_at = -float("inf")
        self._cap: int | None = None
        """The last `seq_cap` answer that was logged."""

    def started(self, job: InferenceJob) -> None:
        now = self._clock()
        if job.request_id in self._jobs:  # started again without an end: forget that run
            self._forget(self._jobs[job.request_id])
        self._jobs[job.request_id] = _Progress(job, now, len(job.prompt_token_ids))
        self._prefilling += 1
        self.totals.jobs_started += 1
        if len(self._jobs) == 1:  # the engine was idle until now: silence starts counting
            self._last_progress = now
        if self._on_started is not None:
            self._on_started(job)

    def silent_for(self) -> float | None:
        """Seconds since the engine last produced output for any job held here (or since it
        became busy); None while no job is held (an idle engine is not silent)."""
        if not self._jobs:
            return None
        return self._clock() - self._last_progress

    def produced(self, request_id: str, new_tokens: int, cached_tokens: int) -> None:
        """One engine step's output for a job (called per step of every running job)."""
        now = self._last_progress = self._clock()
        progress = self._jobs.get(request_id)
        if progress is None:
            return
        if progress.first_token_at is None:
            progress.first_token_at = progress.last_token_at = now
            progress.cached_tokens = cached_tokens
            prefilled = progress.prompt_tokens - cached_tokens
            self.totals.prefilled_tokens += max(prefilled, 0)
            self.totals.cached_tokens += min(cached_tokens, progress.prompt_tokens)
            seconds = now - progress.started_at
            if prefilled > 0 and seconds > 0:
                self._prefills.append((prefilled, seconds))
            self._computed.append(max(prefilled, 0))
            self._prefilling -= 1
            self._producing += 1
            self._context += progress.prompt_tokens
            self._last_first_token_at = now
        elif new_tokens > 0:
            gap = now - progress.last_token_at
            progress.last_token_at = now
            per_token = gap / new_tokens
            average = self._token_gap_s or per_token
            self._token_gap_s = average + TOKEN_GAP_WEIGHT * (per_token - average)
            if (
                self.step_times is not None
                and self._prefilling == 0  # no prefill chunk in this step
                and self._last_first_token_at <= now - gap  # nor a first token in the gap
                and now - self._last_sample_at >= SAMPLE_SPACING * gap  # a step not sampled
                and progress.job.sampling.n == 1
            ):
                self._last_sample_at = now
                self.step_times.add(self._producing, self._context, gap / new_tokens)
        progress.produced += new_tokens
        self._context += new_tokens
        self.totals.generated_tokens += new_tokens

    def finished(self, request_id: str) -> None:
        progress = self._jobs.pop(request_id, None)
        if progress is None:
            return
        self._forget(progress)
        if progress.first_token_at is not None:
            self._durations.append(self._clock() - progress.started_at)
            self._outputs.append(progress.produced)

    def _forget(self, progress: _Progress) -> None:
        """Take a job out of the step-timing counts."""
        if progress.first_token_at is None:
            self._prefilling -= 1
        else:
            self._producing -= 1
            self._context -= progress.prompt_tokens + progress.produced

    def seq_cap(self, max_num_seqs: int, prefill_tokens_per_s: float = 0.0) -> int:
        """The most sequences that may run so that their token gaps stay within the TPOT SLO
        (`StepTimeModel.cap`, at the context per sequence of recent steps, with the prefill
        each brings: `prefill_s_per_seq`, at the engine's ``prefill_tokens_per_s`` or, without
        it, this tracker's own measure): ``max_num_seqs`` without an SLO, the slow start
        (`workers.step_time.START_CAP`) before the steps say anything, never above
        ``max_num_seqs``, never below 1. Logs ``seq_cap_changed`` when the answer moves by a
        tenth or more from the last one logged (a cap at its balance point moves by one
        sequence every refit)."""
        model = self.step_times
        if model is None or self.tpot_slo_s is None:
            return max_num_seqs
        fit = model.current
        if fit is None:
            return model.cap(self.tpot_slo_s, 0.0, max_num_seqs)  # the slow start
        prefill_s = self.prefill_s_per_seq(prefill_tokens_per_s)
        cap = model.cap(self.tpot_slo_s, fit.context_per_seq, max_num_seqs, prefill_s)
        previous = self._cap if self._cap is not None else max_num_seqs
        if abs(cap - previous) >= max(1.0, previous / 10):
            self._cap = cap
            log.info(
                "seq_cap_changed",
                old=previous,
                new=cap,
                step_s=round(fit.predict(cap, cap * fit.context_per_seq), 5),
                slo=self.tpot_slo_s,
                context_per_seq=round(fit.context_per_seq),
                prefill_s_per_seq=round(prefill_s, 5),
                samples=fit.samples,
            )
        return cap

    def prefill_s_per_seq(self, prefill_tokens_per_s: float = 0.0) -> float:
        """Seconds of prefill a running sequence adds to each token gap of its neighbours
        while the slots stay full: its successor's prompt (the mean prompt tokens recent jobs
        prefilled) at ``prefill_tokens_per_s`` (else this tracker's measure), spread over its
        own output: the mean tokens recent finished jobs produced or, before one finished, the
        mean max_tokens of the held jobs (an upper bound, so the term starts low, not high).
        0 before a job prefilled."""
        rate = prefill_tokens_per_s if prefill_tokens_per_s > 0 else self.prefill_tokens_per_s()
        if self._outputs:
            output = sum(self._outputs) / len(self._outputs)
        else:
            limits = [p.job.sampling.max_tokens for p in self._jobs.values()]
            output = sum(limits) / len(limits) if limits else 0.0
        if rate <= 0 or output <= 0 or not self._computed:
            return 0.0
        return sum(self._computed) / len(self._computed) / rate / output

    def mean_job_s(self) -> float:
        """Mean slot-holding time of recent jobs that ran (0 until one finished)."""
        return sum(self._durations) / len(self._durations) if self._durations else 0.0

    def slot_ends_in_s(self) -> tuple[float, ...]:
        """Per held job, the seconds until it is expected to end (soonest first): its expected
        output tokens left at the decode step time of recent tokens, plus its prefill at the
        measured rate if it has no first token yet. Empty until a step has been timed and a
        job has finished (before that, a job's output could only be guessed as its max_tokens,
        often the whole context: the gateway then judges on the pool's backlog instead)."""
        step_s = self._token_gap_s
        if step_s <= 0 or not self._outputs:
            return ()
        typical = _percentile(self._outputs, OUTPUT_QUANTILE)
        rate = self.prefill_tokens_per_s()
        ends = []
        for p in self._jobs.values():
            limit = p.job.sampling.max_tokens
            expected = min(limit, max(typical, p.produced + 1))
            left_s = max(expected - p.produced, 0) * step_s
            if p.first_token_at is None and rate > 0:
                left_s += (p.prompt_tokens - p.cached_tokens) / rate
            ends.append(round(left_s, 4))
        return tuple(sorted(ends))

    def teams(self) -> tuple[str, ...]:
        """The teams of the held jobs, sorted."""
        return tuple(sorted({p.job.team for p in self._jobs.values()}))

    def prefill_waiting_tokens(self) -> int:
        """Prompt tokens of held jobs that have not produced a token yet."""
        return sum(p.prompt_tokens for p in self._jobs.values() if p.first_token_at is None)

    def not_started(self) -> set[str]:
        """Held jobs that have not produced a token yet (their KV use may not show yet)."""
        return {rid for rid, p in self._jobs.items() if p.first_token_at is None}

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def outstanding_tokens(self) -> int:
        """Prompt tokens still to prefill plus output tokens still to decode."""
        total = 0
        for p in self._jobs.values():
            if p.first_token_at is None:
                total += len(p.job.prompt_token_ids)
            total += max(p.job.sampling.max_tokens - p.produced, 0)
        return total

    def prefill_tokens_per_s(self) -> float:
        tokens = sum(t for t, _ in self._prefills)
        seconds = sum(s for _, s in self._prefills)
        return tokens / seconds if seconds > 0 else 0.0

    def running_jobs(self) -> list[RunningJob]:
        return [
            RunningJob(
                request_id=p.job.request_id,
                tier=p.job.tier,
                started_at=p.started_at,
                tokens_done=p.produced,
            )
            for p in self._jobs.values()
        ]


def _percentile(values: deque[int], quantile: float) -> int:
    """The `quantile` of `values` (nearest rank; 0 when empty)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
