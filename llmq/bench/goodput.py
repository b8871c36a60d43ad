"""``llmq bench goodput``: requests that meet their SLOs per second, against the offered rate,
for llmq and for vLLM's own OpenAI server side by side.

Each offered rate is a Poisson arrival schedule (the same one, from the same seed, for both
targets); rates alternate which target goes first. A request counts towards goodput when it
succeeded with TTFT <= the TTFT SLO and TPOT <= the TPOT SLO (TTFT to the first content chunk,
TPOT the decode time per output token after it). llmq refuses what its admission predicts
would miss the SLO (429); vLLM's server takes everything, so past its knee everyone is late.
For llmq the gateway's own record of its TTFT predictions (`/metrics`) gives the predictor's
error over each rate.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Literal

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field, PositiveFloat

from llmq import services
from llmq.bench.cpu import cpu_per_1k_tokens, cpu_snapshot, dev_stack_pids
from llmq.bench.overhead import (
    PROMPTS,
    TARGETS,
    OverheadSettings,
    Target,
    machine_description,
    open_clients,
    start_direct_server,
    warm_up,
)
from llmq.bench.stats import percentile
from llmq.bench.stream_request import RequestSample, one_request

PREDICTION_METRIC = "llmq_ttft_prediction_abs_error_ratio"
WARM_UP_CONCURRENCY = 4
"""Warm-up requests sent to a target at once."""


class GoodputSettings(BaseModel):
    base_url: str = "http://127.0.0.1:8000/v1"
    """llmq's OpenAI-compatible base URL (its `/metrics` is at the same host)."""
    api_key: str = Field(default="sk-llmq-dev", exclude=True)
    model: str = "smollm2-135m-instruct"
    rates: list[PositiveFloat] = Field(default_factory=lambda: [0.25, 0.5, 1.0], min_length=1)
    """Offered request rates (requests per second), one level each."""
    requests: int = Field(default=24, ge=1)
    """Requests per (rate, target), unless ``duration_s`` is set."""
    duration_s: PositiveFloat | None = None
    """Seconds of arrivals per (rate, target): each rate then offers ``rate * duration_s``
    requests, so every level lasts as long and an overload is sustained (a fixed count gives
    a fast rate only a few seconds, too short for the direct server's queue to build)."""
    max_tokens: int = Field(default=32, ge=1)
    warm_up_requests: int = Field(default=8, ge=0)
    """Unmeasured requests to each target before the first rate, `WARM_UP_CONCURRENCY` at a
    time (after one alone that must succeed): the engines run their first batches of several
    sequences (a CPU engine's first ones take seconds), and llmq's TTFT fit and TPOT cap have
    their first samples. Without it the first rate measured a cold start, not the rate."""
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.1
    seed: int = 1
    targets: list[Target] = Field(default_factory=lambda: list(TARGETS))
    kv_cache_gib: float = 1.0
    request_timeout_s: float = 300.0
    engine: Literal["vllm", "simulated"] = "vllm"
    """What the stack's workers run. ``simulated``: the direct target is the queue-less
    simulated server (`llmq.bench.sim_server`) over the same modelled GPU (``LLMQ_SIM_*``)
    instead of vLLM's server, and every report says SIMULATED."""
    max_num_seqs: int = 16
    """The direct target's sequence slots: set it to the stack's workers' (the local
    stack's ``LLMQ_DEV_MAX_NUM_SEQS``)."""
    max_model_len: int = 2048


class RateResult(BaseModel):
    """One target at one offered rate."""

    target: Target
    rate: float
    offered: int
    wall_s: float
    admitted: int
    refused: int
    """429s (llmq's admission; vLLM's server never refuses)."""
    failed: int
    """Other errors."""
    good: int
    """Succeeded within both SLOs."""
    goodput: float
    """Good requests per second of the level's wall time."""
    ttft_met: int = 0
    """Succeeded with TTFT within its SLO (whatever their TPOT): of those admitted, how many
    admission was right to admit."""
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    prediction_error_p50: float | None = None
    prediction_error_p95: float | None = None
    """|predicted - actual| / actual of llmq's TTFT predictions (bucket upper bounds)."""
    output_tokens: int = 0
    """Tokens streamed to the successful requests."""
    cpu_s_per_1k_tokens: dict[str, float] = Field(default_factory=dict)
    """CPU seconds per 1,000 streamed tokens of each of the target's processes (llmq: the
    local stack's gateway, worker, broker, Redis; direct: its server), where readable."""


class GoodputReport(BaseModel):
    settings: GoodputSettings
    machine: str
    engine: str = "vLLM"
    """What both targets ran (the modelled GPU and model when simulated)."""
    results: list[RateResult] = Field(default_factory=list)

    def result(self, target: Target, rate: float) -> RateResult | None:
        return next((r for r in self.results if r.target == target and r.rate == rate), None)


def requests_at(settings: GoodputSettings, rate: float) -> int:
    """How many requests a rate offers: ``duration_s`` worth of arrivals, or ``requests``."""
    if settings.duration_s is None:
        return settings.requests
    return max(1, round(rate * settings.duration_s))


def arrivals(rate: float, count: int, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the start): exponential gaps of mean 1/rate."""
    draw = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += draw.expovariate(rate)
    return times


def tpot_of(sample: RequestSample) -> float | None:
    if sample.ttft_s is None or sample.output_tokens <= 1:
        return None
    return (sample.e2e_s - sample.ttft_s) / (sample.output_tokens - 1)


def summarize_rate(
    target: Target,
    rate: float,
    wall_s: float,
    samples: list[RequestSample],
    settings: GoodputSettings,
) -> RateResult:
    refused = [s for s in samples if s.error and s.error.startswith("RateLimitError")]
    ok = [s for s in samples if s.error is None]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpot = [t for t in (tpot_of(s) for s in ok) if t is not None]
    good = [
        s
        for s in ok
        if s.ttft_s is not None
        and s.ttft_s <= settings.ttft_slo_s
        and (tpot_of(s) or 0.0) <= settings.tpot_slo_s
    ]
    return RateResult(
        target=target, rate=rate, offered=len(samples), wall_s=wall_s,
        output_tokens=sum(s.output_tokens for s in ok),
        admitted=len(samples) - len(refused), refused=len(refused),
        failed=len(samples) - len(ok) - len(refused), good=len(good),
        ttft_met=sum(1 for t in ttft if t <= settings.ttft_slo_s),
        goodput=len(good) / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=percentile(ttft, 50), ttft_p95_s=percentile(ttft, 95),
        tpot_p50_s=percentile(tpot, 50), tpot_p95_s=percentile(tpot, 95),
    )  # fmt: skip


def bucket_counts(metrics_text: str, metric: str = PREDICTION_METRIC) -> dict[float, float]:
    """Cumulative bucket counts (upper bound -> count) of a histogram, summed over labels."""
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name == f"{metric}_bucket":
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
    return counts


def quantile_from_buckets(
    before: dict[float, float], after: dict[float, float], q: float
) -> float | None:
    """The q-quantile (0-1) of what was observed between two scrapes, interpolated linearly
    within the bucket it falls in, as Prometheus's ``histogram_quantile`` does (the lowest
    bucket starts at 0; inf: beyond the largest finite bucket); None when nothing was
    observed."""
    delta = sorted((bound, after.get(bound, 0.0) - before.get(bound, 0.0)) for bound in after)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, count in delta:
        if count >= q * total:
            if bound == float("inf") or count <= below:
                return bound
            return lower + (bound - lower) * (q * total - below) / (count - below)
        lower, below = bound, count
    return float("inf")


async def _scrape(metrics_url: str) -> dict[float, float]:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(metrics_url)
    return bucket_counts(response.text) if response.status_code == 200 else {}


async def run_rate(
    client: openai.AsyncOpenAI, settings: GoodputSettings, target: Target, rate: float
) -> RateResult:
    """`requests_at` the rate, on its Poisson schedule (the same for every target)."""
    schedule = arrivals(rate, requests_at(settings, rate), settings.seed)
    start = time.perf_counter()

    async def at(index: int, offset: float) -> RequestSample:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        prompt = f"Request {index}. {PROMPTS[index % len(PROMPTS)]}"
        return await one_request(client, settings.model, prompt, settings.max_tokens)

    samples = await asyncio.gather(*(at(i, t) for i, t in enumerate(schedule)))
    return summarize_rate(target, rate, time.perf_counter() - start, list(samples), settings)


async def warm_up_batches(client: openai.AsyncOpenAI, settings: GoodputSettings) -> None:
    """`GoodputSettings.warm_up_requests`, in batches; their outcomes (a refusal included)
    are not measured."""
    left = settings.warm_up_requests
    while left > 0:
        batch = min(left, WARM_UP_CONCURRENCY)
        left -= batch
        await asyncio.gather(
            *(
                one_request(client, settings.model, PROMPTS[i % len(PROMPTS)], settings.max_tokens)
                for i in range(batch)
            )
        )


def _metrics_url(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1") + "/metrics"


async def _measure(
    settings: GoodputSettings, urls: dict[Target, str], pids: dict[Target, dict[str, int]]
) -> list[RateResult]:
    clients = open_clients(urls, settings.api_key, settings.request_timeout_s)
    results: list[RateResult] = []
    try:
        await warm_up(clients, settings.model, settings.max_tokens)
        for client in clients.values():
            await warm_up_batches(client, settings)
        for index, rate in enumerate(settings.rates):
            order = TARGETS if index % 2 == 0 else TARGETS[::-1]
            for target in (t for t in order if t in clients):
                before = await _scrape(_metrics_url(urls[target])) if target == "llmq" else {}
                cpu_before = cpu_snapshot(pids.get(target, {}))
                result = await run_rate(clients[target], settings, target, rate)
                result.cpu_s_per_1k_tokens = cpu_per_1k_tokens(
                    cpu_before, cpu_snapshot(pids.get(target, {})), result.output_tokens
                )
                if target == "llmq":
                    after = await _scrape(_metrics_url(urls[target]))
                    result.prediction_error_p50 = quantile_from_buckets(before, after, 0.5)
                    result.prediction_error_p95 = quantile_from_buckets(before, after, 0.95)
                results.append(result)
    finally:
        for client in clients.values():
            await client.close()
    return results


def simulated_engine_description() -> str:
    """What the simulated engines model (stack and direct alike: `modelled_settings`)."""
    from llmq.bench.sim_server import modelled_settings

    sim = modelled_settings()
    return (
        f"SIMULATED {sim.sim_model} on {sim.sim_tensor_parallel}x {sim.sim_gpu} "
        f"(time scale {sim.sim_time_scale:g}; direct = llmq.bench.sim_server)"
    )


def _start_direct(settings: GoodputSettings) -> tuple[services.ManagedProcess, str]:
    """vLLM's own server on the model, or the simulated direct server on simulated stacks."""
    from llmq.modelbuild import ensure_model

    model_path = ensure_model(settings.model)
    if settings.engine == "simulated":
        from llmq.bench.sim_server import start_sim_server

        return start_sim_server(
            settings.model,
            model_path,
            max_num_seqs=settings.max_num_seqs,
            max_model_len=settings.max_model_len,
        )
    direct = OverheadSettings(
        model=settings.model,
        kv_cache_gib=settings.kv_cache_gib,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
    )
    return start_direct_server(direct, model_path)


def run_goodput(settings: GoodputSettings) -> GoodputReport:
    """Run every rate on every target (starts and stops the direct vLLM server)."""
    report = GoodputReport(settings=settings, machine=machine_description())
    if settings.engine == "simulated":
        report.engine = simulated_engine_description()
    urls: dict[Target, str] = {}
    pids: dict[Target, dict[str, int]] = {}
    if "llmq" in settings.targets:
        urls["llmq"] = settings.base_url
        pids["llmq"] = {k: v for k, v in dev_stack_pids().items() if k not in ("moto", "batch")}
    server: services.ManagedProcess | None = None
    try:
        if "direct" in settings.targets:
            server, urls["direct"] = _start_direct(settings)
            pids["direct"] = {"server": server.pid}
        report.results = asyncio.run(_measure(settings, urls, pids))
    finally:
        if server is not None:
            services.stop(server, timeout=30)
    return report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_report(report: GoodputReport) -> str:
    s = report.settings
    per_level = (
        f"{s.requests} requests"
        if s.duration_s is None
        else f"{s.duration_s:g} s of arrivals (rate x {s.duration_s:g} requests)"
    )
    lines = [
        f"llmq bench goodput: model {s.model}, engine {report.engine}, "
        f"{per_level} per rate and target, "
        f"max_tokens {s.max_tokens}, SLO TTFT <= {s.ttft_slo_s:g} s and TPOT <= "
        f"{s.tpot_slo_s * 1000:g} ms, machine {report.machine} (cpus {os.cpu_count()})",
        f"{'rate':>6} {'target':<7}{'offered':>8}{'admitted':>9}{'refused':>8}{'failed':>7}"
        f"{'good':>6}{'goodput/s':>10}{'TTFT met':>9}{'TTFT p50':>9}{'p95':>7}"
        f"{'TPOT p50':>9}{'p95':>6}"
        f"{'pred err p50':>13}{'p95':>6}",
    ]
    for r in report.results:
        lines.append(
            f"{r.rate:>6g} {r.target:<7}{r.offered:>8}{r.admitted:>9}{r.refused:>8}{r.failed:>7}"
            f"{r.good:>6}{r.goodput:>10.2f}{r.ttft_met:>9}{_ms(r.ttft_p50_s):>9}{_ms(r.ttft_p95_s):>7}"
            f"{_ms(r.tpot_p50_s):>9}{_ms(r.tpot_p95_s):>6}"
            f"{_ratio(r.prediction_error_p50):>13}{_ratio(r.prediction_error_p95):>6}"
        )
    lines.append(
        "(TTFT met: succeeded with TTFT within the SLO; prediction error: |predicted - actual|"
        " / actual, interpolated within its buckets)"
    )
    lines.append("CPU seconds per 1,000 streamed tokens (the benchmark's own client excluded):")
    for r in report.results:
        if r.cpu_s_per_1k_tokens:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r.cpu_s_per_1k_tokens.items()))
            total = sum(r.cpu_s_per_1k_tokens.values())
            lines.append(f"{r.rate:>6g} {r.target:<7} total {total:.3f}: {parts}")
    return "\n".join(lines)


def write_json(report: GoodputReport, path: Path) -> None:
    path.write_text(report.model_dump_json(indent=2))
