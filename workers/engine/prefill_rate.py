"""The engine's prefill throughput, from its own steps: prompt tokens per second of the steps
that prefilled them.

vLLM hands its stat loggers one record per engine step, after the step; a step's prompt tokens
are those of the requests whose prefill it finished. The step's length is the time since the
record before it, but only while the engine was busy: a step that follows an idle spell began
when the first request of the busy spell was handed to the engine, not at the last record
(which may be seconds earlier). Counting the idle spell (or capping it, as this adapter once
did at 1 s) made a 50 ms prefill of 46 tokens read as 46 tokens/s instead of about 900, and
admission then predicted seconds of TTFT for bursts the engine served in a few hundred
milliseconds; capping also made a 13 s prefill on a slow machine read as 13x too fast.

Pure logic, no vLLM: the adapter calls `submitted` and `stepped`.
"""

from __future__ import annotations

from collections import deque

WINDOW = 64
"""Recent prefill steps the rate is computed over."""


class PrefillRate:
    """Prompt tokens per second over the recent steps that prefilled them."""

    def __init__(self, window: int = WINDOW) -> None:
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        """(prompt tokens, step seconds) of recent steps that finished prefills."""
        self._last_step_at = 0.0
        self._busy_since = 0.0
        """When a request was handed to an idle engine (0: none since the last step)."""

    def submitted(self, now: float, *, idle: bool) -> None:
        """A request was handed to the engine at `now`; `idle`: nothing else was in flight."""
        if idle:
            self._busy_since = now

    def stepped(self, now: float, prompt_tokens: int) -> None:
        """The engine reported a step at `now` that finished prefilling `prompt_tokens`."""
        began = max(self._last_step_at, self._busy_since)
        if prompt_tokens > 0 and began > 0 and now > began:
            self._steps.append((prompt_tokens, now - began))
        self._last_step_at = now

    def tokens_per_s(self) -> float:
        """The rate over the window (0 until a prefill step was timed)."""
        seconds = sum(s for _, s in self._steps)
        return sum(t for t, _ in self._steps) / seconds if seconds > 0 else 0.0

    @property
    def steps(self) -> tuple[tuple[int, float], ...]:
        """The timed steps in the window, oldest first."""
        return tuple(self._steps)
