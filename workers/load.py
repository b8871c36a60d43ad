"""What this worker holds and how fast it prefills: the load it reports in heartbeats.

The gateway routes on `outstanding_tokens` (bounded load) and admits on the pool's summed
`prefill_tokens_per_s`; the pull loop picks preemption victims from `running_jobs()`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from schemas.messages import InferenceJob
from workers.headroom import RunningJob


@dataclass
class _Progress:
    job: InferenceJob
    started_at: float
    first_token_at: float | None = None
    cached_tokens: int = 0
    produced: int = 0


class LoadTracker:
    """Per-job progress of the jobs this worker holds, and a prefill-rate estimate."""

    def __init__(self, window: int = 64) -> None:
        self._jobs: dict[str, _Progress] = {}
        # (prefilled tokens, seconds to first token) of recent jobs: the rate is the ratio of
        # the sums, so long prompts (where the rate matters) weigh more than short ones.
        self._prefills: deque[tuple[int, float]] = deque(maxlen=window)
        self._durations: deque[float] = deque(maxlen=window)
        """Seconds recent finished jobs held a slot, start to finish."""
        self._last_progress = time.monotonic()

    def started(self, job: InferenceJob) -> None:
        self._jobs[job.request_id] = _Progress(job=job, started_at=time.monotonic())
        if len(self._jobs) == 1:  # the engine was idle until now: silence starts counting
            self._last_progress = time.monotonic()

    def silent_for(self) -> float | None:
        """Seconds since the engine last produced output for any job held here (or since it
        became busy); None while no job is held (an idle engine is not silent)."""
        if not self._jobs:
            return None
        return time.monotonic() - self._last_progress

    def produced(self, request_id: str, new_tokens: int, cached_tokens: int) -> None:
        self._last_progress = time.monotonic()
        progress = self._jobs.get(request_id)
        if progress is None:
            return
        if progress.first_token_at is None:
            progress.first_token_at = time.monotonic()
            progress.cached_tokens = cached_tokens
            prefilled = len(progress.job.prompt_token_ids) - cached_tokens
            seconds = progress.first_token_at - progress.started_at
            if prefilled > 0 and seconds > 0:
                self._prefills.append((prefilled, seconds))
        progress.produced += new_tokens

    def finished(self, request_id: str) -> None:
        progress = self._jobs.pop(request_id, None)
        if progress is not None and progress.first_token_at is not None:
            self._durations.append(time.monotonic() - progress.started_at)

    def mean_job_s(self) -> float:
        """Mean slot-holding time of recent jobs that ran (0 until one finished)."""
        return sum(self._durations) / len(self._durations) if self._durations else 0.0

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
