"""End to end: the OpenAI SDK -> gateway -> Kafka -> real vLLM worker -> Redis -> SSE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from llmq.services import LOCALHOST
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import InferenceJob, UsageRecord
from tests.e2e.conftest import IDLE_MODEL, SIM_MODEL, STRICT_MODEL, Stack
from tests.polling import eventually
from tests.topic_reading import read_until
from tests.unit.test_dashboard import exported_families, missing, queried_metrics
from topics import catalog

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello."}]


def test_models_are_listed(client: openai.OpenAI, stack: Stack) -> None:
    listed = [m.id for m in client.models.list().data]
    # The registry outlives test modules: deployments other tests registered are listed too.
    configured = [stack.model, STRICT_MODEL, SIM_MODEL, IDLE_MODEL]
    assert [m for m in listed if m in configured] == configured


def test_non_streaming_completion_has_consistent_usage(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="tiny-llama",
        messages=HELLO,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert out.usage is not None
    assert 0 < out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    if choice.finish_reason == "length":
        assert out.usage.completion_tokens == 12


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    kwargs = {"model": "tiny-llama", "messages": HELLO, "max_tokens": 16, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content  # the first event carries the first token
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_without_include_usage_has_no_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=HELLO,
            max_tokens=4,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert chunks and all(c.usage is None for c in chunks)


def test_repeated_long_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    system = " ".join(f"rule {i}: answer politely and briefly." for i in range(40))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
    usages = []
    for _ in range(2):
        out = client.chat.completions.create(
            model="tiny-llama",
            messages=messages,
            max_tokens=2,  # type: ignore[arg-type]
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        usages.append(out.usage)
    assert usages[0].prompt_tokens >= 256  # two whole 128-token blocks on the CPU engine
    assert usages[1].prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
    assert usages[1].prompt_tokens_details.cached_tokens <= usages[1].prompt_tokens  # type: ignore[union-attr]


class EngineLoad:
    """Reads the worker's heartbeat over one Redis connection kept for the whole test."""

    def __init__(self, redis_url: str) -> None:
        self._redis = Redis.from_url(redis_url, socket_connect_timeout=10)

    async def running(self) -> int:
        raw = await self._redis.get(catalog.replica_key("e2e-worker-0"))
        return ReplicaHeartbeat.model_validate_json(raw).running if raw else -1

    async def close(self) -> None:
        await self._redis.aclose()


@pytest.fixture
async def engine_load(stack: Stack) -> AsyncIterator[EngineLoad]:
    load = EngineLoad(stack.redis_url)
    yield load
    await load.close()


ATTEMPTS = 4
"""The random model may end its answer (EOS) before a cancel reaches the worker; such an
attempt proves nothing about cancelling, so the scenario runs again with another seed."""


async def _usage_since(stack: Stack, since: float) -> UsageRecord:
    """The usage record of the one request that finished after `since` (tests run in turn)."""
    (usage,) = await read_until(
        stack.kafka_bootstrap,
        catalog.USAGE_TOPIC,
        UsageRecord.model_validate_json,
        lambda u: u.finished_at > since,
    )
    return usage


async def test_cancelled_stream_frees_the_engine(stack: Stack, engine_load: EngineLoad) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0
    )
    for seed in range(ATTEMPTS):
        t0 = time.time()
        stream = await client.chat.completions.create(
            model=stack.model,
            messages=HELLO,
            max_tokens=1500,
            seed=seed,
            stream=True,  # type: ignore[arg-type]
        )
        received = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
            if received >= 3:
                break
        await stream.close()
        closed_at = time.monotonic()
        await eventually(engine_load.running, lambda n: n == 0, within=2.0)
        assert time.monotonic() - closed_at <= 2.5
        usage = await _usage_since(stack, t0)
        if usage.finish_reason == "cancelled":
            assert 3 <= usage.completion_tokens < 1500  # billed for what ran, not max_tokens
            break
    else:
        pytest.fail(f"every one of {ATTEMPTS} streams ended on its own before the cancel")
    await client.close()


def test_wrong_key_is_401(stack: Stack) -> None:
    bad = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model=stack.model, messages=HELLO)  # type: ignore[arg-type]
    assert info.value.code == "invalid_api_key"
    missing = httpx.post(f"{stack.base_url}/v1/chat/completions", json={})
    assert missing.status_code == 401
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=HELLO)  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 5}, "n"), ({"temperature": 5}, "temperature"), ({"max_tokens": 0}, "max_tokens")],
)
def test_invalid_parameters_are_400(
    client: openai.OpenAI, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-llama", messages=HELLO, **extra)  # type: ignore[call-overload]
    assert info.value.param == param
    assert info.value.status_code == 400


def test_prompt_longer_than_context_is_400(client: openai.OpenAI, stack: Stack) -> None:
    huge = "word " * (stack.max_model_len * 2)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=stack.model,
            messages=[{"role": "user", "content": huge}],  # type: ignore[arg-type]
        )
    assert info.value.code == "context_length_exceeded"


def test_json_schema_output_validates(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    out = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
        max_tokens=64,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    content = out.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), schema)


async def test_each_request_is_a_readable_message_on_its_job_topic(
    client: openai.OpenAI, stack: Stack
) -> None:
    out = await asyncio.to_thread(
        client.chat.completions.create,
        model=stack.model,
        messages=HELLO,
        max_tokens=2,  # type: ignore[arg-type]
    )
    jobs = await read_until(
        stack.kafka_bootstrap,
        catalog.job_topic(stack.pool, "interactive"),
        InferenceJob.model_validate_json,
        lambda j: j.request_id == out.id,
    )
    job = next(j for j in jobs if j.request_id == out.id)
    assert job.team == "e2e" and job.model == stack.model and job.sampling.max_tokens == 2
    assert json.loads(json.dumps(job.model_dump()))["reply_to"].startswith("llmq:reply:")


def test_metrics_count_requests(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key)
    client.chat.completions.create(model=stack.model, messages=HELLO, max_tokens=2)
    text = httpx.get(f"{stack.base_url}/metrics").text
    samples = _samples(text)
    served = {"model": stack.model, "version": "1", "team": "e2e", "tier": "interactive"}
    assert any(
        name == "llmq_requests_total" and labels == {**served, "status": "ok"} and value >= 1
        for name, labels, value in samples
    ), "no ok requests by model, version, team and tier"
    assert any(
        name == "llmq_prompt_tokens_total" and labels.get("cache") == "miss" and value > 0
        for name, labels, value in samples
    )
    assert "llmq_time_to_first_token_seconds_bucket" in text
    assert _value(samples, "llmq_queue_time_seconds_count", served) >= 1  # told by the worker
    # The pool's replicas, from their heartbeats (what KEDA's Prometheus trigger reads).
    assert f'llmq_pool_replicas{{pool="{stack.pool}",state="ready"}}' in text
    assert f'llmq_pool_kv_cache_usage{{pool="{stack.pool}"}}' in text
    # The job topics' lag, read by the gateway's topic watcher at start and every 5 s since.
    assert _value(samples, "llmq_job_topic_lag", {"pool": stack.pool, "tier": "interactive"}) >= 0
    assert _value(samples, "llmq_relay_connected", {}) == 1
    # The worker that served it counts it on its probe port (the batch service, restarted
    # by an earlier test, may still be starting: wait until it is up).
    stack.wait_ready(_probe(stack, "batch"))
    worker = _samples(httpx.get(f"{_probe(stack, 'worker')}/metrics").text)
    replica = {"pool": stack.pool, "model": stack.model, "replica": "e2e-worker-0"}
    assert _value(worker, "llmq_worker_jobs_started_total", replica) >= 1
    assert _value(worker, "llmq_worker_generated_tokens_total", replica) >= 2
    assert _value(worker, "llmq_worker_state", {**replica, "state": "ready"}) == 1
    assert _value(worker, "llmq_worker_queue_time_seconds_count",
                  {**replica, "tier": "interactive"}) >= 1  # fmt: skip
    # Every query of the Grafana dashboard names a metric that a process of the stack exports.
    pages = [text] + [httpx.get(f"{_probe(stack, p)}/metrics").text for p in ("worker", "batch")]
    exported = set().union(*(exported_families(page) for page in pages))
    assert missing(queried_metrics(), exported) == set()


def _probe(stack: Stack, process: str) -> str:
    return f"http://{LOCALHOST}:{stack.probe_ports[process]}"


Sample = tuple[str, dict[str, str], float]


def _samples(text: str) -> list[Sample]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _value(samples: list[Sample], name: str, labels: dict[str, str]) -> float:
    """The value of the one sample of `name` with exactly `labels`."""
    found = [v for n, ls, v in samples if n == name and ls == labels]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


async def test_abandoned_non_streaming_request_frees_the_engine(
    stack: Stack, engine_load: EngineLoad
) -> None:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers) as http:
        for seed in range(ATTEMPTS):
            t0 = time.time()
            body = {"model": stack.model, "messages": HELLO, "max_tokens": 1500, "seed": seed}
            request = asyncio.create_task(http.post("/v1/chat/completions", json=body, timeout=30))
            await eventually(engine_load.running, lambda n: n >= 1, within=5.0)
            request.cancel()  # the caller gives up and closes its connection
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await eventually(engine_load.running, lambda n: n == 0, within=2.0)
            usage = await _usage_since(stack, t0)
            if usage.finish_reason == "cancelled":
                assert usage.completion_tokens < 1500
                return
    pytest.fail(f"every one of {ATTEMPTS} requests ended on its own before the cancel")
