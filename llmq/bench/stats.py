"""Small statistics helpers for the benchmarks (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pydantic import BaseModel


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between the closest ranks.

    Same as ``numpy.percentile(values, q)`` (method "linear"): the rank is ``q/100 * (n-1)``.
    Returns None for an empty input. Raises ValueError for q outside [0, 100] or a NaN value.
    """
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    data = sorted(values)
    if not data:
        return None
    if any(math.isnan(v) for v in data):
        raise ValueError("percentile of values containing NaN")
    rank = q / 100.0 * (len(data) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    fraction = rank - low
    return data[low] + (data[high] - data[low]) * fraction


def mean(values: Sequence[float]) -> float | None:
    """The arithmetic mean, or None for an empty input."""
    return sum(values) / len(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt_ms(seconds: float | None, digits: int = 0) -> str:
    """Seconds as milliseconds for a table cell; "-" when missing."""
    return "-" if seconds is None else f"{seconds * 1000:.{digits}f}"


def fmt_pct(share: float | None) -> str:
    """A 0..1 share as a percentage for a table cell; "-" when missing."""
    return "-" if share is None else f"{share * 100:.1f}%"


class LatencyPercentiles(BaseModel):
    """TTFT and TPOT percentiles (seconds), shared by the load and simulation reports."""

    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
