"""`llmq bench lora`: what LoRA adapters cost on a running stack, measured side by side.

Against the local stack (`llmq dev up`, whose deployment runs LoRA), with the real adapters
of `llmq.adapterbuild` pushed to its S3 server and registered for the caller's team:

- cold against warm: the time to first token of an adapter's first request (the worker
  fetches it from S3, verifies its digest and loads it into the engine) against its later
  ones. Every cold run registers a copy that no worker has seen (a nonce file changes its
  digest), so each is really cold.
- mixed against base: output tokens per second at one concurrency with requests spread over
  the base and three adapters, against the base alone; rounds alternate which goes first.
  Every request generates exactly `max_tokens` tokens (`ignore_eos`), so both sides do the
  same work.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import aioboto3
import httpx
import openai
from pydantic import BaseModel

from llmq.adapterbuild import PHRASE_ADAPTERS, SIGNOFF_ADAPTER
from llmq.bench.stats import fmt_ms, percentile, ratio
from llmq.bench.stream_request import RequestSample, one_request
from llmq.modelbuild import ensure_model
from workers.s3_weights import S3WeightsSource
from workers.weights import folder_digest

BUCKET = "llmq-bench-adapters"
PROMPT = "Write a short story about a lighthouse keeper."


class LoraBenchSettings(BaseModel):
    base_url: str
    api_key: str
    model: str
    """The base deployment (its stable version must set `engine_args.max_lora_rank`)."""
    s3_endpoint: str
    concurrency: int = 8
    requests: int = 32
    """Requests per throughput round and target."""
    rounds: int = 2
    max_tokens: int = 32
    cold_runs: int = 3


class LoraBenchReport(BaseModel):
    cold_ttft_s: list[float]
    warm_ttft_s: list[float]
    base_ttft_s: list[float]
    base_tokens_per_s: list[float]
    mixed_tokens_per_s: list[float]
    errors: int


async def _push(endpoint: str, folder: Path, name: str) -> tuple[str, str]:
    """Upload `folder` under a new prefix; (its uri, its digest)."""
    session = aioboto3.Session()
    async with session.client("s3", endpoint_url=endpoint) as s3:
        buckets = {b["Name"] for b in (await s3.list_buckets()).get("Buckets", [])}
        if BUCKET not in buckets:
            await s3.create_bucket(Bucket=BUCKET)
    uri = f"s3://{BUCKET}/{name}"
    async with S3WeightsSource(session, endpoint_url=endpoint) as source:
        await source.push(folder, uri)
    return uri, folder_digest(folder)


async def _register(http: httpx.AsyncClient, s: LoraBenchSettings, name: str, folder: Path) -> None:
    uri, sha256 = await _push(s.s3_endpoint, folder, f"{name}-{secrets.token_hex(4)}")
    body = {"base": s.model, "weights_uri": uri, "sha256": sha256, "rank": 8}
    response = await http.put(f"/adapters/{name}", json=body)
    if response.status_code not in (200, 201):
        raise RuntimeError(f"registering {name} failed: {response.status_code} {response.text}")


async def _cold_copy(http: httpx.AsyncClient, s: LoraBenchSettings, name: str) -> None:
    """Register `name` as a copy of the signoff adapter no worker has loaded yet."""
    with tempfile.TemporaryDirectory(prefix="llmq-bench-lora-") as tmp:
        copy = Path(tmp) / "adapter"
        shutil.copytree(ensure_model(SIGNOFF_ADAPTER), copy)
        (copy / "nonce.txt").write_text(secrets.token_hex(16) + "\n")
        await _register(http, s, name, copy)


async def _round(
    client: openai.AsyncOpenAI, s: LoraBenchSettings, models: list[str]
) -> tuple[float, list[RequestSample]]:
    """`s.requests` requests over `models` in turn, `s.concurrency` at once; (tokens/s, samples)."""
    gate = asyncio.Semaphore(s.concurrency)
    extra: dict[str, object] = {"ignore_eos": True}

    async def one(i: int) -> RequestSample:
        async with gate:
            return await one_request(client, models[i % len(models)], PROMPT, s.max_tokens, extra)

    started = time.perf_counter()
    samples = await asyncio.gather(*(one(i) for i in range(s.requests)))
    wall = time.perf_counter() - started
    return sum(x.output_tokens for x in samples if x.error is None) / wall, samples


async def run_lora_bench_async(s: LoraBenchSettings) -> LoraBenchReport:
    headers = {"Authorization": f"Bearer {s.api_key}"}
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
    adapters = [f"bench-{name.removeprefix('smollm2-lora-')}" for name in PHRASE_ADAPTERS]
    report = LoraBenchReport(cold_ttft_s=[], warm_ttft_s=[], base_ttft_s=[],
                             base_tokens_per_s=[], mixed_tokens_per_s=[], errors=0)  # fmt: skip
    async with httpx.AsyncClient(base_url=s.base_url, headers=headers, timeout=120) as http:
        for adapter, built in zip(adapters, PHRASE_ADAPTERS, strict=True):
            await _register(http, s, adapter, ensure_model(built))
        await _round(client, s.model_copy(update={"requests": s.concurrency}), [s.model, *adapters])
        for run in range(s.cold_runs):
            name = f"bench-cold-{run}-{secrets.token_hex(3)}"
            await _cold_copy(http, s, name)
            cold = await one_request(client, name, PROMPT, s.max_tokens)
            warm = [await one_request(client, name, PROMPT, s.max_tokens) for _ in range(3)]
            base = [await one_request(client, s.model, PROMPT, s.max_tokens) for _ in range(3)]
            for sample in (cold, *warm, *base):
                report.errors += sample.error is not None
            if cold.ttft_s is not None:
                report.cold_ttft_s.append(cold.ttft_s)
            report.warm_ttft_s += [x.ttft_s for x in warm if x.ttft_s is not None]
            report.base_ttft_s += [x.ttft_s for x in base if x.ttft_s is not None]
            await http.delete(f"/adapters/{name}")
        for i in range(s.rounds):
            order = [[s.model], [s.model, *adapters]]
            for models in order if i % 2 == 0 else order[::-1]:
                tokens_per_s, samples = await _round(client, s, models)
                report.errors += sum(x.error is not None for x in samples)
                (
                    report.base_tokens_per_s if len(models) == 1 else report.mixed_tokens_per_s
                ).append(tokens_per_s)
    await client.close()
    return report


def run_lora_bench(settings: LoraBenchSettings) -> LoraBenchReport:
    return asyncio.run(run_lora_bench_async(settings))


def format_report(s: LoraBenchSettings, r: LoraBenchReport) -> str:
    def p50(values: list[float]) -> str:
        return fmt_ms(percentile(values, 50))

    base, mixed = percentile(r.base_tokens_per_s, 50), percentile(r.mixed_tokens_per_s, 50)
    cold_over_warm = ratio(percentile(r.cold_ttft_s, 50), percentile(r.warm_ttft_s, 50))
    lines = [
        f"model {s.model}, {s.max_tokens} output tokens per request",
        "",
        "time to first token (p50; each cold run is a copy no worker has loaded):",
        f"  cold adapter  {p50(r.cold_ttft_s):>8} ms  ({len(r.cold_ttft_s)} runs: "
        + ", ".join(fmt_ms(v) for v in r.cold_ttft_s)
        + ")",
        f"  warm adapter  {p50(r.warm_ttft_s):>8} ms",
        f"  base          {p50(r.base_ttft_s):>8} ms",
        f"  cold / warm   {cold_over_warm:.2f}x" if cold_over_warm else "  cold / warm   -",
        "",
        f"throughput at concurrency {s.concurrency}, {s.requests} requests per round, "
        f"{s.rounds} rounds alternating:",
        "  base alone           " + ", ".join(f"{v:.1f}" for v in r.base_tokens_per_s) + " tok/s",
        "  base + 3 adapters    " + ", ".join(f"{v:.1f}" for v in r.mixed_tokens_per_s) + " tok/s",
        f"  mixed / base (p50)   {ratio(mixed, base):.2f}x" if base and mixed else "  -",
        f"errors: {r.errors}",
    ]
    return "\n".join(lines)
