"""``llmq bench chaos``: a mixed load on the local stack while a worker is SIGKILLed.

Poisson arrivals of chat completions (streaming and not, interactive and batch tier) run for
``duration_s``; at ``kill_at_s`` one worker's process tree gets SIGKILL (its supervisor restarts
it) and, optionally, Redis restarts at ``restart_redis_at_s``. Every request's outcome is then
checked against the usage topic and the job-run counters (`llmq.bench.chaos_model` says what
each figure means). The promise under test: 0 lost and 0 duplicated.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import openai
import structlog
from pydantic import BaseModel
from redis.asyncio import Redis

from llmq import faults
from llmq.bench.chaos_model import ChaosFigures, ChaosRequest, tally
from schemas.messages import UsageRecord
from topics import catalog
from topics.kafka_replay import KafkaTopicReader
from topics.redis_attempts import RedisJobAttempts
from topics.redis_relay import RedisReplicaDirectory

log = structlog.get_logger()

QUESTIONS = (
    "Write a short poem about the sea.", "Explain what a queue is.", "List five fruits.",
    "Describe a rainy day.", "What is a prime number?", "Tell me about the moon.",
)  # fmt: skip


class ChaosSettings(BaseModel):
    """One chaos run (JSON through ``--settings``)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str = "sk-llmq-dev"
    model: str = "smollm2-135m-instruct"
    duration_s: float = 60.0
    """How long requests keep arriving."""
    rate: float = 3.0
    """Requests per second (Poisson)."""
    stream_share: float = 0.5
    """Share of requests that stream (the rest wait for the whole answer)."""
    batch_share: float = 0.1
    """Share of non-streaming requests sent at the batch tier."""
    max_tokens: int = 64
    kill_at_s: float = 20.0
    """When the worker is killed (seconds after the first request)."""
    kill_worker: str | None = None
    """Which worker part to kill (default: the first in `llmq dev status`)."""
    restart_redis_at_s: float | None = None
    """When to restart Redis too (None: never)."""
    request_timeout_s: float = 300.0
    """A request with no outcome after this long counts as lost."""
    settle_s: float = 60.0
    """How long to wait for the usage records of finished requests."""
    ready_timeout_s: float = 600.0
    """How long to wait, before starting, for every worker to heartbeat ready."""
    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: str = "redis://127.0.0.1:6379/0"
    seed: int = 0


async def send_request(client: openai.AsyncOpenAI, s: ChaosSettings, req: ChaosRequest) -> None:
    messages = [{"role": "user", "content": QUESTIONS[req.index % len(QUESTIONS)]}]
    common = dict(model=s.model, messages=messages, max_tokens=s.max_tokens, seed=req.index)
    sent = time.monotonic()
    try:
        if req.stream:
            stream = await client.chat.completions.create(
                **common, stream=True, extra_body={"tier": req.tier}
            )  # type: ignore[call-overload]
            finished = False
            async for chunk in stream:
                req.request_id = chunk.id
                req.served_by = chunk.system_fingerprint
                if chunk.choices and chunk.choices[0].delta.content:
                    if req.ttft_s is None:
                        req.ttft_s = time.monotonic() - sent
                    req.tokens_seen += 1
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
            req.outcome, req.detail = ("completed", "") if finished else ("lost", "no finish")
        else:
            completion = await client.chat.completions.create(
                **common, extra_body={"tier": req.tier}
            )  # type: ignore[call-overload]
            req.request_id = completion.id
            req.served_by = completion.system_fingerprint
            req.outcome = "completed"
    except openai.APITimeoutError:
        req.outcome, req.detail = "lost", "client timeout"
    except openai.APIConnectionError as exc:
        req.outcome, req.detail = "lost", type(exc).__name__
    except openai.APIStatusError as exc:
        code = str(exc.code or exc.status_code)
        if exc.status_code in (429, 503):
            req.outcome, req.detail = "refused", code
        else:
            req.outcome = "interrupted" if code == "stream_interrupted" else "failed"
            req.detail = code
            req.request_id = exc.response.headers.get("x-request-id") or req.request_id
    except openai.APIError as exc:  # an error event in an open stream
        code = str(exc.code or "error")
        req.outcome = "interrupted" if code == "stream_interrupted" else "failed"
        req.detail = code


async def _faults(s: ChaosSettings, t0: float, timeline: list[str]) -> None:
    """Inject the faults on schedule (sleeping until each is due is the schedule)."""
    plan: list[tuple[float, str]] = [(s.kill_at_s, "kill")]
    if s.restart_redis_at_s is not None:
        plan.append((s.restart_redis_at_s, "redis"))
    for at, what in sorted(plan):
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        now = time.monotonic() - t0
        if what == "kill":
            name = s.kill_worker or faults.worker_names()[0]
            pids = await asyncio.to_thread(faults.kill_worker, name)
            timeline.append(f"{now:6.1f}s SIGKILL {name} (pids {', '.join(map(str, pids))})")
        else:
            new = await asyncio.to_thread(faults.restart_redis)
            timeline.append(f"{now:6.1f}s restarted redis (pid {new.pid})")


async def _wait_for_workers(s: ChaosSettings, redis: Redis) -> None:
    wanted = len(faults.worker_names())
    directory = RedisReplicaDirectory(redis)
    deadline = time.monotonic() + s.ready_timeout_s
    while True:
        ready = [r for r in await directory.replicas() if r.state == "ready" and r.healthy]
        if len(ready) >= wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ready)} of {wanted} workers ready after {s.ready_timeout_s}s")
        await asyncio.sleep(1.0)  # heartbeats live in Redis: polled, there is no event


async def usage_counts(s: ChaosSettings, since: float, wanted: set[str]) -> Counter[str]:
    """Usage records per request id, re-read until every wanted id has one or time is up."""
    deadline = time.monotonic() + s.settle_s
    while True:
        counts: Counter[str] = Counter()
        async with KafkaTopicReader(s.kafka_bootstrap, client_id="llmq-bench-chaos") as reader:
            await reader.open(catalog.USAGE_TOPIC, since=since)
            async for record in reader.records():
                usage = UsageRecord.model_validate_json(record.value)
                counts[usage.request_id] += 1
        if wanted <= set(counts) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(2.0)  # usage follows the caller's outcome by a few ms to seconds


async def run_chaos(s: ChaosSettings) -> tuple[ChaosFigures, list[str]]:
    redis = Redis.from_url(s.redis_url)
    await _wait_for_workers(s, redis)
    rng = random.Random(s.seed)
    client = openai.AsyncOpenAI(
        base_url=s.base_url, api_key=s.api_key, max_retries=0, timeout=s.request_timeout_s
    )
    since = time.time() - 1.0
    t0 = time.monotonic()
    timeline: list[str] = []
    injector = asyncio.create_task(_faults(s, t0, timeline))
    requests: list[ChaosRequest] = []
    tasks: list[asyncio.Task[None]] = []
    at = rng.expovariate(s.rate)
    while at < s.duration_s:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        stream = rng.random() < s.stream_share
        tier = "batch" if not stream and rng.random() < s.batch_share else "interactive"
        req = ChaosRequest(len(requests), stream, tier, started_s=at)
        requests.append(req)
        tasks.append(asyncio.create_task(send_request(client, s, req)))
        at += rng.expovariate(s.rate)
    await asyncio.gather(*tasks)
    await injector
    timeline.append(f"{time.monotonic() - t0:6.1f}s every request ended")
    accepted = {r.request_id for r in requests if r.request_id and r.outcome != "refused"}
    counts = await usage_counts(s, since, accepted)
    await redis.aclose()  # its connections may predate a Redis restart: read on new ones
    redis = Redis.from_url(s.redis_url)
    attempts = RedisJobAttempts(redis)
    runs = {
        r.request_id: await attempts.runs(catalog.attempt_key(r.request_id))
        for r in requests
        if r.request_id and r.outcome == "completed"
    }
    await client.close()
    await redis.aclose()
    for r in requests:
        if r.outcome in ("lost", "failed"):
            log.warning("request_not_served", index=r.index, outcome=r.outcome, detail=r.detail,
                        request_id=r.request_id, stream=r.stream)  # fmt: skip
    return tally(requests, counts, runs), timeline


def format_chaos(figures: ChaosFigures, timeline: list[str]) -> str:
    return "\n".join([*timeline, *figures.lines()])
