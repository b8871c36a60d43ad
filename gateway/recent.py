"""The last minutes of each model's requests, in memory, for the operator page: TTFT and TPOT
percentiles over a sliding window and outcome counts since start (Prometheus keeps the long
history; this answers "how is it now" without one)."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class _ModelWindow:
    ttft: deque[tuple[float, float]] = field(default_factory=deque)
    tpot: deque[tuple[float, float]] = field(default_factory=deque)
    outcomes: Counter[str] = field(default_factory=Counter)


class RecentRequests:
    """Per model: (time, value) samples of the last `window_s` seconds (at most
    `max_samples` each) and outcomes since start."""

    def __init__(self, window_s: float = 300.0, max_samples: int = 5_000) -> None:
        self.window_s = window_s
        self._max = max_samples
        self._models: dict[str, _ModelWindow] = {}

    def _model(self, model: str) -> _ModelWindow:
        return self._models.setdefault(model, _ModelWindow())

    def ttft(self, model: str, seconds: float, now: float | None = None) -> None:
        self._add(self._model(model).ttft, seconds, now)

    def tpot(self, model: str, seconds: float, now: float | None = None) -> None:
        self._add(self._model(model).tpot, seconds, now)

    def finished(self, model: str, outcome: str) -> None:
        self._model(model).outcomes[outcome] += 1

    def _add(self, samples: deque[tuple[float, float]], value: float, now: float | None) -> None:
        samples.append((time.time() if now is None else now, value))
        if len(samples) > self._max:
            samples.popleft()

    def p95(self, model: str, kind: str, now: float | None = None) -> float | None:
        """The p95 of `kind` (`ttft` or `tpot`) over the window; None without samples."""
        window = self._models.get(model)
        if window is None:
            return None
        samples: deque[tuple[float, float]] = getattr(window, kind)
        since = (time.time() if now is None else now) - self.window_s
        while samples and samples[0][0] < since:
            samples.popleft()
        values = sorted(value for _, value in samples)
        return values[math.ceil(0.95 * len(values)) - 1] if values else None  # nearest rank

    def outcomes(self, model: str) -> dict[str, int]:
        window = self._models.get(model)
        return dict(window.outcomes) if window is not None else {}
