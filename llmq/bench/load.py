"""``llmq bench load``: a mixed workload replayed against a running llmq gateway.

Streams (each with its own seeded RNG, so a stream is identical in every run that has it):

* interactive from team A: Poisson arrivals at ``interactive_rate``, a long fixed system prompt
  (prefix-cacheable) and varied user questions;
* optionally the same from team B (``team_b_rate``), and a team flood: team B sending
  interactive requests at ``team_flood_rate``;
* optionally a batch flood: ``batch_flood`` batch-tier requests (``extra_body={"tier":
  "batch"}``) from ``batch_team``, all submitted at ``batch_flood_at_s``.

Every request streams with usage included (``openai.AsyncOpenAI``, no client retries); a 429 is
recorded with its Retry-After, never retried. With ``redis_url``, worker heartbeats
(``llmq:replica:*``) are sampled for the engines' busy share (running > 0) and KV use. TTFT is
request start to first content chunk; the worker buffers batch output, so a batch request's TTFT
is its completion. Aggregation lives in `llmq.bench.load_model`.

Scenarios run one workload twice, without and with a flood, and compare interactive TTFT p95
(`run_batch_flood_scenario`: acceptance is flood/no-flood <= 1.25; `run_team_flood_scenario`:
team A with and without team B flooding). Loopback gateways only; counts and times are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel

from llmq.bench.lean_client import lean_session, one_lean_request
from llmq.bench.load_model import (
    GroupResult,
    LoadReport,
    LoadSettings,
    RequestSample,
    Tier,
    busy_share,
    format_report,
    poisson_arrivals,
    retry_after_seconds,
    summarize,
)

__all__ = [
    "SCENARIOS", "Comparison", "LoadReport", "LoadSettings", "compare", "format_comparison",
    "format_report", "run_batch_flood_scenario", "run_load", "run_team_flood_scenario",
]  # fmt: skip

ACCEPTABLE_TTFT_P95_RATIO = 1.25
"""Interactive TTFT p95 with a flood over the same run without it."""

SYSTEM_PROMPT = (
    "You are the support assistant of {team}, an online bank. Answer briefly and politely. "
    + " ".join(
        f"Policy {i}: refunds for card payments are possible within {30 + i} days; fees over "
        f"{10 + i} euros need a supervisor; never ask for a full card number or a PIN."
        for i in range(1, 25)
    )
)
QUESTIONS: tuple[str, ...] = (
    "How do I reset my password?", "Why was my card declined at the supermarket?",
    "Can I get a refund for a duplicate payment?", "How long does a transfer abroad take?",
    "What are the fees for a currency exchange?", "How do I close my savings account?",
    "Where can I see my monthly statement?", "My card is lost; what should I do?",
    "Can I raise my daily withdrawal limit?", "How do I dispute a transaction?",
    "Is there an overdraft charge on my account?", "How do I add a joint account holder?",
)  # fmt: skip


async def one_request(
    client: openai.AsyncOpenAI,
    settings: LoadSettings,
    sample: RequestSample,
    messages: list[ChatCompletionMessageParam],
) -> None:
    """Send one streaming chat completion and fill ``sample`` in."""
    batch = sample.tier == "batch"
    start = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=settings.model, messages=messages,
            max_tokens=settings.batch_max_tokens if batch else settings.max_tokens,
            temperature=0.0, stream=True, stream_options={"include_usage": True},
            extra_body={"tier": sample.tier},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.usage is not None:
                sample.completion_tokens = chunk.usage.completion_tokens
                sample.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                sample.cached_tokens = (details.cached_tokens or 0) if details else 0
            if chunk.choices and chunk.choices[0].delta.content and sample.ttft_s is None:
                sample.ttft_s = time.perf_counter() - start
        sample.e2e_s = time.perf_counter() - start
    except openai.RateLimitError as exc:
        sample.status = "rate_limited"
        sample.retry_after_s = retry_after_seconds(exc.response.headers.get("retry-after"))
    except openai.OpenAIError as exc:
        sample.status, sample.error = "error", f"{type(exc).__name__}: {exc}"


def _messages(
    team: str, rng: random.Random, index: int, system_prompts: int = 1
) -> list[ChatCompletionMessageParam]:
    desk = rng.randrange(system_prompts)
    question = f"{rng.choice(QUESTIONS)} (ticket {index})"
    owner = team if system_prompts == 1 else f"{team} (help desk {desk})"
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(team=owner)},
        {"role": "user", "content": question},
    ]


def _streams(s: LoadSettings) -> list[tuple[str, Tier, str, float]]:
    """(name, tier, team, rate) of every Poisson stream, in a fixed order (RNG seeds)."""
    streams: list[tuple[str, Tier, str, float]] = [
        ("interactive-a", "interactive", s.team_a, s.interactive_rate),
        ("interactive-b", "interactive", s.team_b, s.team_b_rate),
        ("team-flood", "interactive", s.team_b, s.team_flood_rate),
    ]
    return [st for st in streams if st[3] > 0]


async def _sample_heartbeats(
    redis_url: str, interval_s: float, out: list[list[tuple[int, float]]]
) -> None:
    from redis.asyncio import Redis

    from topics.redis_relay import RedisReplicaDirectory

    redis = Redis.from_url(redis_url)
    directory = RedisReplicaDirectory(redis)
    try:
        while True:
            beats = await directory.replicas()
            out.append([(b.running, b.kv_cache_usage) for b in beats if b.state == "ready"])
            await asyncio.sleep(interval_s)
    finally:
        await redis.aclose()


async def run_load_async(
    settings: LoadSettings, *, transport: Any = None, stop: asyncio.Event | None = None
) -> LoadReport:
    """Send the whole plan on time, wait (bounded) for every request, summarise.

    With ``stop``, no request is sent once it is set (the rest of the plan is dropped).

    ``transport`` replaces the HTTP transport: a transport of the HTTP library the openai SDK
    is built on (tests pass its ``MockTransport``).
    """
    s = settings
    clients = {
        team: openai.AsyncOpenAI(
            base_url=s.base_url,
            api_key=key,
            timeout=s.request_timeout_s,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(transport=transport) if transport else None,
        )
        for team, key in s.api_keys.items()
    }
    lean = lean_session(s) if s.client == "aiohttp" else None
    samples: list[RequestSample] = []
    tasks: list[asyncio.Task[None]] = []
    plan: list[tuple[float, RequestSample, list[ChatCompletionMessageParam]]] = []
    for name, tier, team, rate in _streams(s):
        rng = random.Random(f"{s.seed}:{name}")
        for n, at in enumerate(
            poisson_arrivals(rate, s.duration_s, rng, s.max_requests_per_stream)
        ):
            plan.append(
                (
                    at,
                    RequestSample(tier=tier, team=team, stream=name, start_s=at),
                    _messages(team, rng, n, s.system_prompts),
                )
            )
    if s.batch_flood and s.batch_flood_at_s < s.duration_s:
        rng = random.Random(f"{s.seed}:batch")
        for n in range(s.batch_flood):
            sample = RequestSample(
                tier="batch", team=s.batch_team, stream="batch-flood", start_s=s.batch_flood_at_s
            )
            plan.append((s.batch_flood_at_s, sample, _messages(s.batch_team, rng, n)))
    plan.sort(key=lambda item: item[0])
    beats: list[list[tuple[int, float]]] = []
    sampler = (
        asyncio.create_task(_sample_heartbeats(s.redis_url, s.sample_interval_s, beats))
        if s.redis_url
        else None
    )
    started = time.perf_counter()
    # `kill -USR1 <pid>` prints where every pending task waits (a run that does not end).
    loop = asyncio.get_running_loop()
    # Deliberately optional: loops without signal support (Windows, not the main thread) skip it.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGUSR1, _print_pending_tasks)
    try:
        for at, sample, messages in plan:
            delay = started + at - time.perf_counter()
            if stop is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(delay, 0))
                if stop.is_set():
                    break
            elif delay > 0:
                await asyncio.sleep(delay)
            sample.start_s = time.perf_counter() - started
            samples.append(sample)
            if lean is not None:
                key = s.api_keys[sample.team]
                sending = one_lean_request(lean, key, s, sample, messages)
            else:
                sending = one_request(clients[sample.team], s, sample, messages)
            tasks.append(asyncio.create_task(sending))
        if tasks:
            await asyncio.wait(tasks, timeout=s.drain_timeout_s)
    finally:
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a task that ignores its cancellation must not hang the run
            await asyncio.wait(tasks, timeout=10)
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        for client in clients.values():
            await client.close()
        if lean is not None:
            await lean.close()
    for sample in samples:
        if sample.status == "ok" and sample.e2e_s is None:
            sample.status, sample.error = "error", "not finished within drain_timeout_s"
    busy, kv = busy_share(beats)
    return LoadReport(
        settings=s, wall_s=time.perf_counter() - started, groups=summarize(s, samples),
        engine_busy_share=busy, kv_use_mean=kv, heartbeat_samples=len(beats), samples=samples,
    )  # fmt: skip


def _print_pending_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=sys.stderr)


def run_load(settings: LoadSettings) -> LoadReport:
    """Run the workload once against the gateway and summarise it."""
    return asyncio.run(run_load_async(settings))


class Comparison(BaseModel):
    """One workload without (baseline) and with a flood (variant), and the TTFT p95 ratio."""

    name: str
    tier: Tier
    team: str
    """The group whose TTFT p95 is compared."""
    baseline: LoadReport
    variant: LoadReport
    baseline_ttft_p95_s: float | None
    variant_ttft_p95_s: float | None
    ratio: float | None
    threshold: float = ACCEPTABLE_TTFT_P95_RATIO
    passed: bool | None


def compare(name: str, team: str, baseline: LoadReport, variant: LoadReport) -> Comparison:
    """Interactive TTFT p95 of ``team``, variant over baseline; passed when within 1.25x."""
    before, after = baseline.group("interactive", team), variant.group("interactive", team)
    b = before.ttft_p95_s if before else None
    v = after.ttft_p95_s if after else None
    ratio = v / b if b and v is not None else None
    return Comparison(
        name=name, tier="interactive", team=team, baseline=baseline, variant=variant,
        baseline_ttft_p95_s=b, variant_ttft_p95_s=v, ratio=ratio,
        passed=None if ratio is None else ratio <= ACCEPTABLE_TTFT_P95_RATIO,
    )  # fmt: skip


def _with(settings: LoadSettings, **update: object) -> LoadSettings:
    return LoadSettings.model_validate({**dict(settings), **update})


def run_batch_flood_scenario(settings: LoadSettings) -> Comparison:
    """Team A's interactive stream alone, then with the batch flood (200 if unset)."""
    flood = settings.batch_flood or 200
    baseline = run_load(_with(settings, batch_flood=0, team_flood_rate=0.0))
    variant = run_load(_with(settings, batch_flood=flood, team_flood_rate=0.0))
    return compare("batch flood", settings.team_a, baseline, variant)


def run_team_flood_scenario(settings: LoadSettings) -> Comparison:
    """Team A's interactive stream alone, then with team B flooding (10x A's rate if unset)."""
    rate = settings.team_flood_rate or min(500.0, 10 * max(settings.interactive_rate, 1.0))
    steady = _with(settings, batch_flood=0, team_flood_rate=0.0)
    baseline = run_load(steady)
    if settings.flood_process:
        from llmq.bench.load_split import run_with_flood_process

        flood = _with(
            settings,
            batch_flood=0,
            interactive_rate=0.0,
            team_flood_rate=rate,
            redis_url=None,
            client=settings.flood_client,
        )
        variant = run_with_flood_process(steady, flood)
    else:
        variant = run_load(_with(settings, batch_flood=0, team_flood_rate=rate))
    return compare("team flood", settings.team_a, baseline, variant)


SCENARIOS: dict[str, Callable[[LoadSettings], Comparison]] = {
    "batch-flood": run_batch_flood_scenario,
    "team-flood": run_team_flood_scenario,
}


def _row(label: str, a: float | None, b: float | None, scale: float = 1000.0) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value * scale:.1f}"

    ratio = "-" if a is None or b is None or a == 0 else f"{b / a:.2f}"
    return f"  {label:<22}{cell(a):>12}{cell(b):>12}{ratio:>9}"


def format_comparison(comparison: Comparison) -> str:
    """Both runs side by side, group by group, then the verdict on the compared TTFT p95."""
    c = comparison
    lines = [
        f"scenario: {c.name} (baseline = without, variant = with)",
        f"  {'':<22}{'baseline':>12}{'variant':>12}{'ratio':>9}",
    ]
    groups = {(g.tier, g.team): g for g in c.baseline.groups}
    groups.update({(g.tier, g.team): g for g in c.variant.groups if (g.tier, g.team) not in groups})
    for tier, team in groups:
        a, b = c.baseline.group(tier, team), c.variant.group(tier, team)
        lines.append(f"{tier} / {team}:")
        for label, field, scale in _ROWS:
            lines.append(_row(label, _get(a, field), _get(b, field), scale))
    verdict = "-" if c.passed is None else ("PASS" if c.passed else "FAIL")
    ratio = "-" if c.ratio is None else f"{c.ratio:.2f}"
    lines.append(
        f"{c.team} interactive TTFT p95 with/without: {ratio} "
        f"(acceptable <= {c.threshold:g}): {verdict}"
    )
    return "\n".join(lines)


_ROWS: tuple[tuple[str, str, float], ...] = (
    ("requests", "requests", 1.0), ("ok", "ok", 1.0), ("429", "rate_limited", 1.0),
    ("errors", "errors", 1.0), ("TTFT p50 (ms)", "ttft_p50_s", 1000.0),
    ("TTFT p95 (ms)", "ttft_p95_s", 1000.0), ("TTFT p99 (ms)", "ttft_p99_s", 1000.0),
    ("TPOT p95 (ms)", "tpot_p95_s", 1000.0), ("goodput (%)", "goodput_share", 100.0),
    ("cache hit (%)", "cache_hit_rate", 100.0), ("batch drain (s)", "drain_s", 1.0),
)  # fmt: skip


def _get(group: GroupResult | None, field: str) -> float | None:
    value = getattr(group, field) if group is not None else None
    return None if value is None else float(value)
