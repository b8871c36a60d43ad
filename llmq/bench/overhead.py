"""``llmq bench overhead``: llmq's queue path against vLLM's own OpenAI server, side by side.

Both targets get the same deterministic prompts at the same concurrency levels through the same
client code (``openai.AsyncOpenAI``, streaming, usage included). The direct target is a
``vllm.entrypoints.openai.api_server`` this module starts on a free loopback port, on the same
model folder, engine settings and engine environment as an llmq worker; llmq is an already
running stack. Levels alternate which target goes first, so neither gets a warmer machine.

TTFT is request start to first content chunk; ITL is the gap between content chunks (a relay
that groups tokens into fewer chunks shows fewer, longer gaps: TPOT, the decode time per output
token after the first, is comparable either way); tokens/s is output tokens over a level's wall
time. With several rounds, the report pools them and also shows each round's llmq/direct
ratios, so a reader sees how much they move between rounds.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from pathlib import Path
from typing import Literal

import openai
from pydantic import BaseModel, Field, PositiveInt

from llmq import paths, services
from llmq.affinity import pin_floating_threads
from llmq.bench.stats import mean, percentile
from llmq.bench.stream_request import RequestSample, one_request, send_with_retries
from llmq.devstack import stack_platform_cores
from llmq.engine_env import engine_environment

Target = Literal["direct", "llmq"]
TARGETS: tuple[Target, ...] = ("direct", "llmq")

STALL_S = 0.1
"""A gap between content chunks longer than this counts as a stall: the TPOT SLO that
`llmq bench goodput` judges by (100 ms), several times a small model's step on a CPU."""

PROMPTS: tuple[str, ...] = (
    "What is the capital of France?", "Explain in two sentences why the sky is blue.",
    "Give me three tips for writing clean Python code.",
    "What is the difference between a list and a tuple?", "Write a haiku about autumn leaves.",
    "How many legs does a spider have?", "Summarize the plot of Romeo and Juliet briefly.",
    "What does HTTP stand for?", "Name five fruits that are red.",
    "Why do we have seasons on Earth?", "What is a prime number? Give an example.",
    "Describe a cat to someone who has never seen one.",
    "What is the boiling point of water at sea level?", "Suggest a name for a small coffee shop.",
    "How does a rainbow form?", "Translate 'good morning' into Spanish and German.",
)  # fmt: skip


class OverheadSettings(BaseModel):
    """What to send where; the defaults match the local stack (`llmq dev up`)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """llmq's OpenAI-compatible base URL."""
    api_key: str = Field(default="sk-llmq-dev", exclude=True)
    """llmq's API key (left out of the JSON report)."""
    model: str = "smollm2-135m-instruct"
    """Model name on llmq; the direct server serves it under the same name."""
    model_path: Path | None = None
    """Folder the direct server loads; default: ``ensure_model(model)``."""
    concurrency: list[PositiveInt] = Field(default_factory=lambda: [1, 16], min_length=1)
    requests: int = Field(default=32, ge=1)
    """Measured requests per (target, concurrency level, round)."""
    rounds: PositiveInt = 1
    """How often every concurrency level runs on each target. Each run alternates which
    target goes first; the report pools the rounds and shows how each round compared."""
    max_tokens: int = Field(default=64, ge=1)
    targets: list[Target] = Field(default_factory=lambda: list(TARGETS))
    max_model_len: int = 2048
    max_num_seqs: int = 16
    dtype: str = "bfloat16"
    kv_cache_gib: float = 1.0
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    retry_refused: int = Field(default=0, ge=0)
    """Re-send a refused request after its Retry-After up to this many times, as the OpenAI
    SDK does (twice by default); 0: a refusal is the request's measurement."""
    direct_frontend: Literal["mirror", "floating"] = "mirror"
    """Where the direct server's threads other than its engine's run on a stack started with
    `LLMQ_DEV_PLATFORM_CORES`: "mirror" moves them off its engine's core (as the stack's
    worker does), "floating" leaves them where Linux puts them (vLLM's own default)."""


class LevelResult(BaseModel):
    """One target at one concurrency level (in one round, or pooled over every round)."""

    target: Target
    concurrency: int
    round: int | None = 0
    """Which round (from 0); None for a result pooled over every round."""
    wall_s: float
    errors: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    tpot_p50_s: float | None
    e2e_p50_s: float | None
    output_tokens: int
    mean_output_tokens: float | None
    tokens_per_s: float | None
    request_tokens_per_s_p50: float | None = None
    """The median request's output tokens over its own end-to-end time: unlike
    `tokens_per_s`, a few requests that stall do not move it."""
    stalls: int = 0
    """Gaps between content chunks longer than `STALL_S`, the TPOT SLO."""
    samples: list[RequestSample]


class OverheadReport(BaseModel):
    settings: OverheadSettings
    machine: str
    cpu_count: int
    direct_model_path: str | None = None
    direct_log: str | None = None
    direct_startup_s: float | None = None
    levels: list[LevelResult] = Field(default_factory=list)

    def rounds(self, target: Target, concurrency: int) -> list[LevelResult]:
        """The per-round results of one target at one level, in round order."""
        return [r for r in self.levels if r.target == target and r.concurrency == concurrency]


class OverheadError(RuntimeError):
    """A target could not be reached or started."""


def machine_description() -> str:
    """CPU count, architecture and CPU model name (from /proc/cpuinfo where there is one)."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = ", " + line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count() or 0} CPUs ({platform.machine()}{name})"


def direct_server_argv(settings: OverheadSettings, model_path: Path, port: int) -> list[str]:
    """vLLM's OpenAI server with the engine settings an llmq worker uses."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path), "--served-model-name", settings.model,
        "--host", services.LOCALHOST, "--port", str(port),
        "--dtype", settings.dtype, "--max-model-len", str(settings.max_model_len),
        "--max-num-seqs", str(settings.max_num_seqs), "--enforce-eager",
        # The KV cache size the worker gives its engine (else vLLM's CPU backend reserves
        # most of the machine's memory and refuses to start beside a running stack).
        "--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * 2**30)),
        "--enable-prefix-caching", "--scheduling-policy", "priority",
        # Sampling defaults come from the request only, as on the worker.
        "--generation-config", "vllm",
        "--disable-log-stats", "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
    ]  # fmt: skip


def direct_omp_cores() -> str:
    """The cores the direct server's engine binds its OpenMP threads to: the upper half of
    this process's cores. The stack's worker binds its engine to the first ones (vLLM's
    "auto"); bound to the same core, the two engines time-shared it while the other idled,
    and the worker's health probe went 30 s without a token (it exited unhealthy)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return "auto"
    upper = cores[len(cores) // 2 :]
    return ",".join(str(core) for core in upper)


def direct_frontend_cores(omp_cores: str) -> list[int]:
    """The cores the direct server's other threads move to once it answers (its API server,
    detokenizing, the engine's scheduler and I/O threads): every core of this process but its
    engine's, the mirror of a stack started with `LLMQ_DEV_PLATFORM_CORES`, whose front ends
    stay off the worker's engine core. Empty (no pinning) when the engine binds "auto"."""
    if omp_cores == "auto" or not hasattr(os, "sched_getaffinity"):
        return []
    engine = {int(core) for core in omp_cores.split(",")}
    return sorted(set(os.sched_getaffinity(0)) - engine)


def direct_pinned_cores(
    layout: Literal["mirror", "floating"], omp_cores: str, stack_pinned: list[int]
) -> list[int]:
    """Where the direct server's floating threads move once it answers: nowhere (empty)
    unless the stack keeps its platform off its engines' cores and the layout is "mirror"."""
    if layout != "mirror" or not stack_pinned:
        return []
    return direct_frontend_cores(omp_cores)


def start_direct_server(
    settings: OverheadSettings, model_path: Path
) -> tuple[services.ManagedProcess, str]:
    """Start the direct vLLM server; return it with its base URL once /health answers 200."""
    port = services.free_port()
    log_path = paths.run_dir() / "bench" / f"vllm-direct-{port}.log"
    omp_cores = direct_omp_cores()
    env = {
        **os.environ,
        **engine_environment(settings.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": omp_cores,
    }
    argv = direct_server_argv(settings, model_path, port)
    proc = services.spawn("vllm-direct", argv, log_path, port=port, env=env)
    root = f"http://{services.LOCALHOST}:{port}"
    try:
        services.wait_ready(
            lambda: services.http_status(f"{root}/health") == 200,
            settings.startup_timeout_s, [proc], "vLLM /health",
        )  # fmt: skip
    except BaseException:
        services.stop(proc, timeout=10)
        raise
    pin_floating_threads(
        proc.pid, direct_pinned_cores(settings.direct_frontend, omp_cores, stack_platform_cores())
    )
    return proc, f"{root}/v1"


def summarize(
    target: Target,
    concurrency: int,
    wall_s: float,
    samples: list[RequestSample],
    round_index: int | None = 0,
) -> LevelResult:
    """Percentiles over the successful requests of one level."""
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.output_tokens for s in ok)
    tpot = [
        (s.e2e_s - s.ttft_s) / (s.output_tokens - 1)
        for s in ok
        if s.ttft_s is not None and s.output_tokens > 1
    ]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    itl = [gap for s in ok for gap in s.itl_s]
    per_request = [s.output_tokens / s.e2e_s for s in ok if s.e2e_s > 0]
    return LevelResult(
        target=target, concurrency=concurrency, round=round_index, wall_s=wall_s,
        errors=len(samples) - len(ok),
        ttft_p50_s=percentile(ttft, 50), ttft_p99_s=percentile(ttft, 99),
        itl_p50_s=percentile(itl, 50), itl_p99_s=percentile(itl, 99),
        tpot_p50_s=percentile(tpot, 50), e2e_p50_s=percentile([s.e2e_s for s in ok], 50),
        output_tokens=tokens, mean_output_tokens=mean([float(s.output_tokens) for s in ok]),
        tokens_per_s=tokens / wall_s if ok and wall_s > 0 else None,
        request_tokens_per_s_p50=percentile(per_request, 50),
        stalls=sum(1 for gap in itl if gap > STALL_S), samples=samples,
    )  # fmt: skip


async def run_level(
    client: openai.AsyncOpenAI,
    settings: OverheadSettings,
    target: Target,
    concurrency: int,
    round_index: int = 0,
) -> LevelResult:
    """settings.requests requests, at most `concurrency` in flight at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(index: int) -> RequestSample:
        async with gate:
            prompt = PROMPTS[index % len(PROMPTS)]
            return await send_with_retries(
                lambda: one_request(client, settings.model, prompt, settings.max_tokens),
                settings.retry_refused,
            )

    start = time.perf_counter()
    samples = await asyncio.gather(*(gated(i) for i in range(settings.requests)))
    wall_s = time.perf_counter() - start
    return summarize(target, concurrency, wall_s, list(samples), round_index)


def open_clients(
    urls: dict[Target, str], api_key: str, timeout_s: float
) -> dict[Target, openai.AsyncOpenAI]:
    """One client per target, without retries (a refusal is a measurement); llmq's key for
    llmq, none for vLLM's own server."""
    keys: dict[Target, str] = {"llmq": api_key, "direct": "EMPTY"}
    return {
        t: openai.AsyncOpenAI(base_url=url, api_key=keys[t], timeout=timeout_s, max_retries=0)
        for t, url in urls.items()
    }


async def warm_up(clients: dict[Target, openai.AsyncOpenAI], model: str, max_tokens: int) -> None:
    """One unmeasured request to each target; `OverheadError` when one fails."""
    for target, client in clients.items():
        warm = await one_request(client, model, PROMPTS[0], max_tokens)
        if warm.error is not None:
            raise OverheadError(f"{target} at {client.base_url}: warm-up failed: {warm.error}")


async def _measure(settings: OverheadSettings, urls: dict[Target, str]) -> list[LevelResult]:
    """Warm every target up, then each level on each target, round after round, alternating
    which target goes first from one level to the next."""
    clients = open_clients(urls, settings.api_key, settings.request_timeout_s)
    levels: list[LevelResult] = []
    runs = [(r, c) for r in range(settings.rounds) for c in settings.concurrency]
    try:
        await warm_up(clients, settings.model, settings.max_tokens)
        for index, (round_index, concurrency) in enumerate(runs):
            order = TARGETS if index % 2 == 0 else TARGETS[::-1]
            for target in (t for t in order if t in clients):
                level = await run_level(clients[target], settings, target, concurrency, round_index)
                levels.append(level)
    finally:
        for client in clients.values():
            await client.close()
    return levels


def run_overhead(settings: OverheadSettings) -> OverheadReport:
    """Run the whole benchmark (starts and stops the direct vLLM server) and return the numbers.

    llmq is checked first (a warm-up request), so a stack that is not running fails fast,
    before an engine is started.
    """
    report = OverheadReport(
        settings=settings, machine=machine_description(), cpu_count=os.cpu_count() or 0
    )
    urls: dict[Target, str] = {}
    if "llmq" in settings.targets:
        urls["llmq"] = settings.base_url
        asyncio.run(_measure(settings.model_copy(update={"concurrency": []}), dict(urls)))
    server: services.ManagedProcess | None = None
    try:
        if "direct" in settings.targets:
            from llmq.modelbuild import ensure_model

            model_path = settings.model_path or ensure_model(settings.model)
            report.direct_model_path = str(model_path)
            started = time.perf_counter()
            server, urls["direct"] = start_direct_server(settings, model_path)
            report.direct_startup_s = time.perf_counter() - started
            report.direct_log = str(server.log_path)
        report.levels = asyncio.run(_measure(settings, urls))
    finally:
        if server is not None:
            services.stop(server, timeout=30)
    return report
