"""The load benchmark's settings, per-request samples and their aggregation (no network).

`llmq.bench.load` sends the requests; this module turns samples into per-(tier, team) results:
requests, ok, 429s (with their Retry-After), errors, TTFT and TPOT percentiles, goodput (both
SLOs met, over all requests sent, 429s and errors included), prompt-cache hit rate (cached over
prompt tokens of successful requests), and for batch the backlog drain (first submission to last
completion). TPOT is (end - first token) / (output tokens - 1), as in ``llmq bench overhead``.
"""

from __future__ import annotations

import email.utils
import random
import time
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt, model_validator

from llmq.bench.stats import LatencyPercentiles, fmt_ms, fmt_pct, mean, percentile

Tier = Literal["interactive", "batch"]
Status = Literal["ok", "rate_limited", "error"]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class LoadSettings(BaseModel):
    """The workload and where it goes; the defaults match the local stack."""

    base_url: str = "http://127.0.0.1:8000/v1"
    api_keys: dict[str, str] = Field(default_factory=lambda: {"dev": "sk-llmq-dev"}, exclude=True)
    """Team -> API key (left out of the JSON report)."""
    model: str = "smollm2-135m-instruct"
    team_a: str = "dev"
    team_b: str = "team-b"
    duration_s: float = Field(default=30.0, gt=0, le=600)
    interactive_rate: float = Field(default=2.0, ge=0, le=500)
    team_b_rate: float = Field(default=0.0, ge=0, le=500)
    team_flood_rate: float = Field(default=0.0, ge=0, le=500)
    batch_flood: int = Field(default=0, ge=0, le=5_000)
    batch_team: str = "dev"
    batch_flood_at_s: float = Field(default=0.0, ge=0)
    system_prompts: PositiveInt = 1
    """Distinct shared system prompts per team (one per help desk); more than one worker's KV
    cache holds shows what prefix-affinity routing buys."""
    max_tokens: PositiveInt = 32
    batch_max_tokens: PositiveInt = 64
    max_requests_per_stream: PositiveInt = 2_000
    ttft_slo_s: PositiveFloat = 0.8
    tpot_slo_s: PositiveFloat = 0.04
    request_timeout_s: PositiveFloat = 120.0
    drain_timeout_s: PositiveFloat = 600.0
    """After the last arrival, how long in-flight (and batch) requests may still run."""
    redis_url: str | None = None
    flood_process: bool = True
    """team-flood: send the flood from a process of its own, so the client work of its
    requests does not delay the timing of the steady team's (its clients would run on other
    machines); False: one event loop sends and times both."""
    client: Literal["openai", "aiohttp"] = "openai"
    """What sends this workload's requests: the OpenAI SDK, or a lean aiohttp client that
    reads streams as bytes (`llmq.bench.lean_client`)."""
    flood_client: Literal["openai", "aiohttp"] = "aiohttp"
    """team-flood: what sends the flood (the steady team is always sent with the OpenAI SDK).
    The SDK's client work for 30 streamed requests a second took 37% of a core beside the
    stack; a real flood's clients run elsewhere."""
    sample_interval_s: PositiveFloat = 0.25
    seed: int = 0

    @model_validator(mode="after")
    def _loopback_and_keys(self) -> LoadSettings:
        if urlparse(self.base_url).hostname not in LOOPBACK_HOSTS:
            raise ValueError(f"base_url must be a loopback address, got {self.base_url}")
        for team, on in self.teams_used().items():
            if on and team not in self.api_keys:
                raise ValueError(f"no API key for team {team!r} (api_keys: team -> key)")
        return self

    def teams_used(self) -> dict[str, bool]:
        used = {self.team_a: self.interactive_rate > 0}
        used[self.team_b] = used.get(self.team_b, False) or (
            self.team_b_rate + self.team_flood_rate > 0
        )
        used[self.batch_team] = used.get(self.batch_team, False) or self.batch_flood > 0
        return used


class RequestSample(BaseModel):
    """One request (times in seconds; ``start_s`` from the start of the run)."""

    tier: Tier
    team: str
    stream: str
    start_s: float
    status: Status = "ok"
    ttft_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    retry_after_s: float | None = None
    error: str | None = None

    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


class GroupResult(LatencyPercentiles):
    """One (tier, team)."""

    tier: Tier
    team: str
    requests: int
    ok: int
    rate_limited: int
    errors: int
    retry_after_p50_s: float | None
    goodput_share: float | None
    cache_hit_rate: float | None
    drain_s: float | None = None
    """Batch: from the first submission to the last completion."""


class LoadReport(BaseModel):
    settings: LoadSettings
    wall_s: float
    groups: list[GroupResult]
    engine_busy_share: float | None = None
    kv_use_mean: float | None = None
    heartbeat_samples: int = 0
    samples: list[RequestSample] = Field(default_factory=list)

    def group(self, tier: Tier, team: str) -> GroupResult | None:
        return next((g for g in self.groups if g.tier == tier and g.team == team), None)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header as seconds: delta-seconds or an HTTP date; None if absent/invalid."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random, limit: int) -> list[float]:
    """Arrival offsets of a Poisson process in [0, duration_s), at most ``limit`` of them."""
    times: list[float] = []
    if rate <= 0:
        return times
    t = rng.expovariate(rate)
    while t < duration_s and len(times) < limit:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def summarize_group(
    tier: Tier, team: str, samples: list[RequestSample], ttft_slo_s: float, tpot_slo_s: float
) -> GroupResult:
    ok = [s for s in samples if s.status == "ok"]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [t for s in ok if (t := s.tpot_s()) is not None]
    good = sum(
        1
        for s in ok
        if s.ttft_s is not None
        and s.ttft_s <= ttft_slo_s
        and ((t := s.tpot_s()) is None or t <= tpot_slo_s)
    )
    prompt = sum(s.prompt_tokens for s in ok)
    finished = [s.start_s + s.e2e_s for s in ok if s.e2e_s is not None]
    drain = None
    if tier == "batch" and finished:
        drain = max(finished) - min(s.start_s for s in samples)
    return GroupResult(
        tier=tier, team=team, requests=len(samples), ok=len(ok),
        rate_limited=sum(1 for s in samples if s.status == "rate_limited"),
        errors=sum(1 for s in samples if s.status == "error"),
        retry_after_p50_s=percentile(
            [s.retry_after_s for s in samples if s.retry_after_s is not None], 50
        ),
        ttft_p50_s=percentile(ttft, 50), ttft_p95_s=percentile(ttft, 95),
        ttft_p99_s=percentile(ttft, 99), tpot_p50_s=percentile(tpot, 50),
        tpot_p95_s=percentile(tpot, 95), tpot_p99_s=percentile(tpot, 99),
        goodput_share=good / len(samples) if samples else None,
        cache_hit_rate=sum(s.cached_tokens for s in ok) / prompt if prompt else None,
        drain_s=drain,
    )  # fmt: skip


def summarize(settings: LoadSettings, samples: list[RequestSample]) -> list[GroupResult]:
    """One result per (tier, team) that sent anything, interactive first."""
    keys = sorted({(s.tier, s.team) for s in samples}, key=lambda k: (k[0] != "interactive", k))
    return [
        summarize_group(
            tier,
            team,
            [s for s in samples if (s.tier, s.team) == (tier, team)],
            settings.ttft_slo_s,
            settings.tpot_slo_s,
        )
        for tier, team in keys
    ]


def busy_share(samples: list[list[tuple[int, float]]]) -> tuple[float | None, float | None]:
    """(share of replica samples with running > 0, mean KV use) over heartbeat snapshots."""
    flat = [entry for snapshot in samples for entry in snapshot]
    busy = mean([1.0 if running > 0 else 0.0 for running, _ in flat])
    return busy, mean([kv for _, kv in flat])


def format_report(report: LoadReport) -> str:
    s = report.settings
    lines = [
        f"llmq bench load: model {s.model}, {s.duration_s:g} s, interactive {s.interactive_rate:g}"
        f" req/s ({s.team_a}), team B {s.team_b_rate:g} req/s, team flood "
        f"{s.team_flood_rate:g} req/s ({s.team_b}), batch flood {s.batch_flood} ({s.batch_team});"
        f" SLO TTFT {s.ttft_slo_s * 1000:g} ms, TPOT {s.tpot_slo_s * 1000:g} ms",
        f"{'tier':<12}{'team':<10}{'req':>6}{'ok':>6}{'429':>5}{'err':>5}"
        f"{'TTFT p50/p95/p99 ms':>22}{'TPOT p50/p95/p99 ms':>22}{'goodput':>9}{'cache':>8}",
    ]
    for g in report.groups:
        ttft = f"{fmt_ms(g.ttft_p50_s)}/{fmt_ms(g.ttft_p95_s)}/{fmt_ms(g.ttft_p99_s)}"
        tpot = f"{fmt_ms(g.tpot_p50_s)}/{fmt_ms(g.tpot_p95_s)}/{fmt_ms(g.tpot_p99_s)}"
        lines.append(
            f"{g.tier:<12}{g.team:<10}{g.requests:>6}{g.ok:>6}{g.rate_limited:>5}{g.errors:>5}"
            f"{ttft:>22}{tpot:>22}{fmt_pct(g.goodput_share):>9}{fmt_pct(g.cache_hit_rate):>8}"
        )
        if g.rate_limited and g.retry_after_p50_s is not None:
            lines.append(f"  429 Retry-After p50 {g.retry_after_p50_s:g} s")
        if g.tier == "batch":
            drain = "-" if g.drain_s is None else f"{g.drain_s:.1f} s"
            lines.append(f"  batch backlog: {g.ok}/{g.requests} completed, drained in {drain}")
    if report.heartbeat_samples:
        lines.append(
            f"engines busy {fmt_pct(report.engine_busy_share)} of samples, KV use mean "
            f"{fmt_pct(report.kv_use_mean)} ({report.heartbeat_samples} heartbeat snapshots)"
        )
    lines.append(f"(wall {report.wall_s:.1f} s)")
    return "\n".join(lines)
