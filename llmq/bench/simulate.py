"""SIMULATION: a pool of `SimulatedGpuEngine` replicas under a Poisson load, in virtual time.

No GPU, no model, no network: the numbers come from the first-principles step-time model in
`workers.engine.sim_model` (weights and KV read at a share of HBM bandwidth per step, prefill at
a share of peak FLOPS), vLLM-style scheduling and prefix caching in `workers.engine.simulated`.
They are estimates to check capacity arithmetic against, not measurements.

The driver is a discrete-event loop over the engines' synchronous core (`submit`, `step`): each
replica steps back to back while it has work, a step's tokens appear at its end, and arrivals
join at the next step. Time is virtual, so the result does not depend on the machine's speed
(``time_scale`` matters only to the asyncio `EngineClient` loop). A router sends each arrival
to the replica with the fewest outstanding tokens (prompt tokens left to prefill plus output
tokens left to decode). Requests arriving in ``[warmup_s, warmup_s + duration_s)`` are measured;
arrivals continue until they have finished, so the measured ones see a steady load.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

from llmq.bench.stats import LatencyPercentiles, fmt_ms, fmt_pct, mean, percentile
from workers.engine.simulated import (
    H100_SXM,
    H200,
    LLAMA_8B,
    LLAMA_70B,
    ReplicaProfile,
    SimStepResult,
    SimulatedGpuEngine,
)

GPUS = {"h100": H100_SXM, "h200": H200}
MODELS = {"llama-70b": LLAMA_70B, "llama-8b": LLAMA_8B}
_PREFIX_BASE = 1_000_000
_UNIQUE_BASE = 1_000_000_000


class SimulationSettings(BaseModel):
    """The pool and the workload; the defaults are the seed's 70B peak (300 req/s, TP-4 H100)."""

    gpu: Literal["h100", "h200"] = "h100"
    model: Literal["llama-70b", "llama-8b"] = "llama-70b"
    tensor_parallel: PositiveInt = 4
    replicas: PositiveInt = 49
    rate: PositiveFloat = 300.0
    """Mean arrivals per second (Poisson)."""
    prompt_tokens: PositiveInt = 1_500
    output_tokens: PositiveInt = 300
    shared_prefix_tokens: int = Field(default=600, ge=0)
    """Leading prompt tokens shared with other requests (a system prompt): prefix-cacheable."""
    prefixes: PositiveInt = 8
    """Distinct shared prefixes (teams' system prompts), chosen uniformly."""
    warmup_s: float = Field(default=12.0, ge=0)
    """Longer than a request's life (~9 s at 300 tokens), so the pool is in steady state."""
    duration_s: PositiveFloat = 15.0
    max_drain_s: PositiveFloat = 60.0
    """Simulated time allowed after the window for measured requests to finish."""
    ttft_slo_s: PositiveFloat = 0.8
    tpot_slo_s: PositiveFloat = 0.04
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt = 2_048
    bandwidth_efficiency: PositiveFloat = 0.8
    compute_utilization: PositiveFloat = 0.4
    sample_interval_s: PositiveFloat = 0.25
    seed: int = 0


class SimulationReport(LatencyPercentiles):
    label: str = "SIMULATION (no GPU, no model: first-principles step times)"
    settings: SimulationSettings
    kv_capacity_tokens: int
    """Per replica."""
    requests: int
    completed: int
    goodput_share: float | None
    """Measured requests that met both SLOs (TTFT and TPOT), over all measured requests."""
    goodput_rps: float
    output_tokens_per_s: float
    """Tokens produced by the whole pool during the window."""
    completed_rps: float
    """Requests (measured or not) finished during the window, per second."""
    prompt_cache_hit_rate: float | None
    kv_use_mean: float | None
    kv_use_max: float | None
    running_mean: float | None
    """Running sequences per replica (sampled)."""
    busy_share: float | None
    """Share of replica time spent stepping (sampled: any running or waiting sequence)."""
    compute_share: float
    """Modelled matmul time (prefill and decode tokens at the achieved FLOPS) over replica time
    in the window: the seed's "% busy" (its 65% for 49 replicas at 300 req/s)."""
    preemptions: int
    """Preemptions (recomputations) suffered by measured requests."""
    simulated_s: float
    wall_s: float


@dataclass
class _Measured:
    arrival: float
    prompt_tokens: int
    first: float | None = None
    done: float | None = None
    generated: int = 0
    cached: int = 0
    preemptions: int = 0


@dataclass(frozen=True)
class _Window:
    """Pool-wide totals over the measured window, every request included."""

    compute_share: float
    tokens: int
    completed: int


def _profile(s: SimulationSettings) -> ReplicaProfile:
    return ReplicaProfile(
        gpu=GPUS[s.gpu], model=MODELS[s.model], tensor_parallel=s.tensor_parallel,
        bandwidth_efficiency=s.bandwidth_efficiency, compute_utilization=s.compute_utilization,
        max_num_batched_tokens=s.max_num_batched_tokens,
    )  # fmt: skip


def _prompt(s: SimulationSettings, rng: random.Random, n: int) -> list[int]:
    shared = min(s.shared_prefix_tokens, s.prompt_tokens - 1)
    start = rng.randrange(s.prefixes) * _PREFIX_BASE
    unique = _UNIQUE_BASE + n * s.prompt_tokens
    return [*range(start, start + shared), *range(unique, unique + s.prompt_tokens - shared)]


def run_simulation(settings: SimulationSettings) -> SimulationReport:
    """Run the pool to the end of the measured requests and summarise them."""
    s = settings
    started = time.perf_counter()
    rng = random.Random(s.seed)
    profile = _profile(s)
    engines = [
        SimulatedGpuEngine(profile, max_num_seqs=s.max_num_seqs, name=f"sim-{i}")
        for i in range(s.replicas)
    ]
    stepping = [False] * s.replicas
    window_end = s.warmup_s + s.duration_s
    stop_at = window_end + s.max_drain_s
    measured: dict[str, _Measured] = {}
    pending = 0
    samples: list[tuple[float, float, bool]] = []  # kv use, running, busy
    # (time, kind, tiebreak, replica): kind 0 = step end, 1 = arrival, 2 = sample
    events: list[tuple[float, int, int, int]] = [(rng.expovariate(s.rate), 1, 0, -1)]
    results: dict[int, SimStepResult] = {}
    counter = 0
    if s.warmup_s < window_end:
        events.append((s.warmup_s, 2, 0, -1))
    heapq.heapify(events)

    compute_s = 0.0

    def start_step(index: int, now: float) -> None:
        nonlocal counter, compute_s
        result = engines[index].step()
        if s.warmup_s <= now < window_end:
            compute_s += profile.compute_time(result.prefill_tokens + result.decode_tokens)
        results[index] = result
        stepping[index] = True
        counter += 1
        heapq.heappush(events, (now + result.duration_s, 0, counter, index))

    now = 0.0
    arrivals = window_tokens = window_done = 0
    while events:
        now, kind, _, index = heapq.heappop(events)
        if now > stop_at or (now >= window_end and pending == 0 and arrivals > 0):
            break
        if kind == 1:
            request_id = f"r{arrivals}"
            prompt = _prompt(s, rng, arrivals)
            arrivals += 1
            target = min(range(s.replicas), key=lambda i: engines[i].outstanding_tokens)
            engines[target].submit(request_id, prompt, s.output_tokens)
            if s.warmup_s <= now < window_end:
                measured[request_id] = _Measured(now, len(prompt))
                pending += 1
            if not stepping[target]:
                start_step(target, now)
            counter += 1
            heapq.heappush(events, (now + rng.expovariate(s.rate), 1, counter, -1))
        elif kind == 2:
            if now < window_end:
                for engine in engines:
                    st = engine.stats()
                    samples.append((st.kv_cache_usage, st.running, engine.has_work))
                counter += 1
                heapq.heappush(events, (now + s.sample_interval_s, 2, counter, -1))
        else:
            emitted = results.pop(index).emitted
            if s.warmup_s <= now < window_end:
                window_tokens += len(emitted)
                window_done += sum(1 for seq in emitted if seq.state == "done")
            for seq in emitted:
                record = measured.get(seq.request_id)
                if record is None:
                    continue
                if record.first is None:
                    record.first, record.cached = now, seq.cached_tokens
                if seq.state == "done":
                    record.done, record.generated = now, seq.generated
                    record.preemptions = seq.preemptions
                    pending -= 1
            stepping[index] = False
            if engines[index].has_work:
                start_step(index, now)
    window = _Window(compute_s / (s.replicas * s.duration_s), window_tokens, window_done)
    wall_s = time.perf_counter() - started
    return _summarise(s, profile, measured, samples, window, now, wall_s)


def _summarise(
    s: SimulationSettings,
    profile: ReplicaProfile,
    measured: dict[str, _Measured],
    samples: list[tuple[float, float, bool]],
    window: _Window,
    simulated_s: float,
    wall_s: float,
) -> SimulationReport:
    records = list(measured.values())
    done = [r for r in records if r.done is not None and r.first is not None]
    # A request still without a token at the end counts with its wait so far (a lower bound).
    ttft = [(simulated_s if r.first is None else r.first) - r.arrival for r in records]
    tpot = {
        id(r): (r.done - r.first) / (r.generated - 1)  # type: ignore[operator]
        for r in done
        if r.generated > 1
    }
    good = [
        r
        for r in done
        if r.first is not None
        and r.first - r.arrival <= s.ttft_slo_s
        and tpot.get(id(r), 0.0) <= s.tpot_slo_s
    ]
    prompt_total = sum(r.prompt_tokens for r in records if r.first is not None)
    return SimulationReport(
        settings=s,
        kv_capacity_tokens=profile.kv_capacity_tokens,
        requests=len(records),
        completed=len(done),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p95_s=percentile(ttft, 95),
        ttft_p99_s=percentile(ttft, 99),
        tpot_p50_s=percentile(tpot.values(), 50),
        tpot_p95_s=percentile(tpot.values(), 95),
        tpot_p99_s=percentile(tpot.values(), 99),
        goodput_share=len(good) / len(records) if records else None,
        goodput_rps=len(good) / s.duration_s,
        output_tokens_per_s=window.tokens / s.duration_s,
        completed_rps=window.completed / s.duration_s,
        prompt_cache_hit_rate=(
            sum(r.cached for r in records if r.first is not None) / prompt_total
            if prompt_total
            else None
        ),
        kv_use_mean=mean([k for k, _, _ in samples]),
        kv_use_max=max((k for k, _, _ in samples), default=None),
        running_mean=mean([float(r) for _, r, _ in samples]),
        busy_share=mean([1.0 if b else 0.0 for _, _, b in samples]),
        compute_share=window.compute_share,
        preemptions=sum(r.preemptions for r in records),
        simulated_s=simulated_s,
        wall_s=wall_s,
    )


def format_simulation(report: SimulationReport) -> str:
    s = report.settings
    return "\n".join(
        [
            f"{report.label}",
            f"pool: {s.replicas} x {s.model} on TP-{s.tensor_parallel} {s.gpu.upper()} "
            f"(KV {report.kv_capacity_tokens:,} tokens/replica, max_num_seqs {s.max_num_seqs}, "
            f"chunk {s.max_num_batched_tokens})",
            f"load: {s.rate:g} req/s Poisson, {s.prompt_tokens} prompt "
            f"({s.shared_prefix_tokens} shared over {s.prefixes} prefixes) / "
            f"{s.output_tokens} output tokens; measured {s.duration_s:g} s after "
            f"{s.warmup_s:g} s warm-up",
            f"requests measured {report.requests}, completed {report.completed}",
            f"TTFT ms  p50 {fmt_ms(report.ttft_p50_s, 1)}  p95 {fmt_ms(report.ttft_p95_s, 1)}  "
            f"p99 {fmt_ms(report.ttft_p99_s, 1)}   (SLO {s.ttft_slo_s * 1000:g})",
            f"TPOT ms  p50 {fmt_ms(report.tpot_p50_s, 1)}  p95 {fmt_ms(report.tpot_p95_s, 1)}  "
            f"p99 {fmt_ms(report.tpot_p99_s, 1)}   (SLO {s.tpot_slo_s * 1000:g})",
            f"goodput  {fmt_pct(report.goodput_share)} of requests, {report.goodput_rps:.1f} req/s",
            f"throughput  {report.output_tokens_per_s:,.0f} output tok/s, "
            f"{report.completed_rps:.1f} req/s",
            f"prefix-cache hit rate {fmt_pct(report.prompt_cache_hit_rate)}",
            f"KV use mean {fmt_pct(report.kv_use_mean)}, max {fmt_pct(report.kv_use_max)}; "
            f"running/replica mean {report.running_mean or 0:.1f}; "
            f"busy {fmt_pct(report.busy_share)}; compute {fmt_pct(report.compute_share)}; "
            f"preemptions {report.preemptions}",
            f"({report.simulated_s:.1f} simulated s in {report.wall_s:.1f} wall s)",
        ]
    )
