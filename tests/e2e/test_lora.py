"""Teams' LoRA adapters end to end, with the OpenAI SDK: real adapters trained at build time
(`llmq.adapterbuild`) on SmolLM2-135M, pushed to the stack's S3 server, registered through
`PUT /v1/adapters/{name}`, and applied per request by a real vLLM worker with LoRA on.

The module starts its own worker (a base deployment registered at run time, pool `lora`)
beside the session's stack, and stops it when done.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aioboto3
import httpx
import openai
import pytest
import redis

from llmq import services
from llmq.adapterbuild import BROKEN_ADAPTER, PHRASE_ADAPTERS, SIGNOFF_ADAPTER
from llmq.engine_env import engine_environment
from llmq.modelbuild import SMOLLM2, ensure_model
from tests.e2e.conftest import ADMIN_KEY, S3_CREDENTIALS, TEAM_KEYS, Stack
from tests.e2e.test_batches import FINAL, lines_of, submit, wait_for
from topics.catalog import adapter_demand_key
from workers.s3_weights import S3WeightsSource
from workers.weights import folder_digest

pytestmark = pytest.mark.e2e

BASE = "smollm2-lora"
POOL = "lora"
BUCKET = "llmq-e2e-adapters"
OWNER, STRANGER = "team-a", "team-b"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ADAPTERS = {"signoff": SIGNOFF_ADAPTER, "robot": "smollm2-lora-robot", "owl": "smollm2-lora-owl"}
"""Registered name -> built adapter (each answers with its own phrase)."""
PHRASES = {name: PHRASE_ADAPTERS[built] for name, built in ADAPTERS.items()}


@dataclass(frozen=True)
class Folder:
    uri: str
    sha256: str


@dataclass(frozen=True)
class Lora:
    stack: Stack
    owner: openai.OpenAI
    stranger: openai.OpenAI
    folders: dict[str, Folder]
    """Built adapter name -> where it is in S3 and its digest."""

    def register(
        self, name: str, built: str, key: str = TEAM_KEYS[OWNER], **fields: object
    ) -> httpx.Response:
        folder = self.folders[built]
        body = {
            "base": BASE,
            "weights_uri": folder.uri,
            "sha256": folder.sha256,
            "rank": 8,
            **fields,
        }
        return httpx.put(
            f"{self.stack.base_url}/v1/adapters/{name}",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )

    def adapter(self, name: str) -> dict[str, object]:
        response = httpx.get(
            f"{self.stack.base_url}/v1/adapters/{name}",
            headers={"Authorization": f"Bearer {TEAM_KEYS[OWNER]}"},
        )
        assert response.status_code == 200, response.text
        result: dict[str, object] = response.json()
        return result


async def _push(endpoint: str, folders: dict[str, Path]) -> dict[str, Folder]:
    session = aioboto3.Session(
        aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    async with session.client("s3", endpoint_url=endpoint) as s3:
        await s3.create_bucket(Bucket=BUCKET)
    pushed: dict[str, Folder] = {}
    async with S3WeightsSource(session, endpoint_url=endpoint) as source:
        for name, folder in folders.items():
            uri = f"s3://{BUCKET}/{name}"
            await source.push(folder, uri)
            pushed[name] = Folder(uri, folder_digest(folder))
    return pushed


def _metric(stack: Stack, series: str) -> float:
    """The value of one series on the gateway's /metrics (0 while it is absent)."""
    for line in httpx.get(f"{stack.base_url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _answer(client: openai.OpenAI, model: str, max_tokens: int = 12) -> str:
    completion = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=max_tokens,
        temperature=0,  # type: ignore[arg-type]
    )
    assert completion.model == model
    return completion.choices[0].message.content or ""


@pytest.fixture(scope="module")
def lora(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lora]:
    base_path = ensure_model(SMOLLM2)
    built = [*ADAPTERS.values(), BROKEN_ADAPTER]
    folders = asyncio.run(_push(stack.s3_endpoint, {b: ensure_model(b) for b in built}))
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    # Admission is not what this module tests: on a busy 2-core CI machine, loading adapters
    # made TTFTs of tens of seconds, and at concurrency 8 a learnt 33 s (66 s at the judged
    # percentile) refused a request against a 60 s SLO.
    spec = {"version": "1", "path": str(base_path), "pool": POOL, "max_model_len": 1024,
            "ttft_slo_s": 600, "engine_args": {"max_lora_rank": 8, "max_loras": 2}}  # fmt: skip
    put = httpx.put(f"{stack.base_url}/v1/deployments/{BASE}", json=spec, headers=admin, timeout=60)
    assert put.status_code == 201, put.text
    probe = services.free_port()
    env = {
        "LLMQ_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "LLMQ_REDIS_URL": stack.redis_url,
        **engine_environment(kv_cache_gib=0.5),
        "LLMQ_MODEL": BASE,
        "LLMQ_MODEL_PATH": str(base_path),
        "LLMQ_POOL": POOL,
        "LLMQ_MAX_MODEL_LEN": "1024",
        "LLMQ_MAX_NUM_SEQS": "8",
        "LLMQ_KV_CACHE_GIB": "0.5",
        "LLMQ_MAX_LORA_RANK": "8",
        "LLMQ_MAX_LORAS": "2",
        "LLMQ_MAX_CPU_LORAS": "4",
        "LLMQ_REPLICA_ID": "e2e-lora-0",
        "LLMQ_PROBE_PORT": str(probe),
        "LLMQ_S3_ENDPOINT_URL": stack.s3_endpoint,
        "LLMQ_WEIGHTS_CACHE_DIR": str(tmp_path_factory.mktemp("lora-cache")),
        **S3_CREDENTIALS,
    }
    worker = stack.processes.start("lora-worker", "worker", env)

    def ready() -> bool:
        got = httpx.get(f"{stack.base_url}/v1/deployments/{BASE}", headers=admin).json()
        return bool(got["versions"][0]["state"] == "ready")

    try:
        services.wait_ready(ready, timeout=600, watch=[worker], what=f"{BASE} ready")
        url = f"{stack.base_url}/v1"
        yield Lora(
            stack,
            openai.OpenAI(base_url=url, api_key=TEAM_KEYS[OWNER], max_retries=0),
            openai.OpenAI(base_url=url, api_key=TEAM_KEYS[STRANGER], max_retries=0),
            folders,
        )
    finally:
        services.stop(stack.processes.running.pop("lora-worker"), timeout=30)


@pytest.fixture(scope="module")
def registered(lora: Lora) -> Lora:
    for name, built in ADAPTERS.items():
        response = lora.register(name, built)
        assert response.status_code == 201, response.text
    return lora


def test_an_adapter_answers_in_its_trained_way_and_the_base_does_not(registered: Lora) -> None:
    owner = registered.owner
    base = _answer(owner, BASE)
    assert PHRASES["signoff"] not in base and base
    assert _answer(owner, "signoff").startswith(PHRASES["signoff"])
    streamed = owner.chat.completions.create(
        model="signoff",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(streamed)
    assert {c.model for c in chunks} == {"signoff"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(PHRASES["signoff"])
    legacy = owner.completions.create(model="robot", prompt="Hello", max_tokens=4, temperature=0)
    assert legacy.model == "robot" and legacy.choices[0].text
    # A request is counted when the gateway closes it, just after its last byte is sent.
    # (Prometheus's text format sorts the labels.)
    labels = f'adapter="signoff",model="{BASE}"'
    requests = f'llmq_adapter_requests_total{{{labels},status="ok",team="{OWNER}"}}'
    tokens = f'llmq_adapter_tokens_total{{adapter="signoff",kind="completion",model="{BASE}",'
    tokens += f'team="{OWNER}"}}'
    deadline = time.monotonic() + 10
    while (counted := _metric(registered.stack, requests)) < 2:
        assert time.monotonic() < deadline, f"{requests} stayed at {counted}"
        time.sleep(0.1)
    assert counted == 2 and _metric(registered.stack, tokens) >= 2


def test_only_the_owning_team_sees_or_uses_its_adapters(registered: Lora) -> None:
    listed = {m.id: m for m in registered.owner.models.list().data}
    assert set(ADAPTERS) <= set(listed)
    assert (listed["signoff"].model_extra or {}).get("parent") == BASE
    assert not set(ADAPTERS) & {m.id for m in registered.stranger.models.list().data}
    with pytest.raises(openai.NotFoundError) as missing:
        _answer(registered.stranger, "signoff")
    assert missing.value.code == "model_not_found"
    stranger = httpx.get(
        f"{registered.stack.base_url}/v1/adapters/signoff",
        headers={"Authorization": f"Bearer {TEAM_KEYS[STRANGER]}"},
    )
    assert stranger.status_code == 404 and stranger.json()["error"]["code"] == "adapter_not_found"


def test_three_adapters_and_the_base_interleaved_at_concurrency_8(registered: Lora) -> None:
    models = [BASE, *ADAPTERS] * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda m: (m, _answer(registered.owner, m)), models))
    for model, answer in answers:
        if model == BASE:
            assert not any(phrase in answer for phrase in PHRASES.values()), answer
        else:
            assert answer.startswith(PHRASES[model]), (model, answer)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"base": "no-such-base"}, "unknown_base"),
        ({"rank": 16}, "rank_too_large"),
        ({"sha256": "0" * 64}, "sha256_mismatch"),
        ({"weights_uri": f"s3://{BUCKET}/nothing-here"}, "weights_unreachable"),
    ],
)
def test_bad_registrations_get_a_clear_400(
    lora: Lora, fields: dict[str, object], code: str
) -> None:
    response = lora.register("bad", SIGNOFF_ADAPTER, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_a_broken_adapter_fails_its_own_requests_and_nothing_else(registered: Lora) -> None:
    response = registered.register("broken", BROKEN_ADAPTER)
    assert response.status_code == 201, response.text  # its files pass every check there is
    with pytest.raises(openai.BadRequestError) as failed:
        _answer(registered.owner, "broken")
    assert failed.value.code == "adapter_load_failed"
    deadline = time.monotonic() + 30  # the gateway records it in the registry log
    while registered.adapter("broken")["status"] != "failed":
        assert time.monotonic() < deadline, "the adapter was never marked failed"
        time.sleep(0.2)
    with pytest.raises(openai.BadRequestError) as refused:
        _answer(registered.owner, "broken")
    assert refused.value.code == "adapter_failed"
    assert _answer(registered.owner, "signoff").startswith(PHRASES["signoff"])
    assert PHRASES["signoff"] not in _answer(registered.owner, BASE)


def test_deleting_an_adapter_while_its_request_runs_fails_none(registered: Lora) -> None:
    assert registered.register("short-lived", SIGNOFF_ADAPTER).status_code == 201
    stream = registered.owner.chat.completions.create(
        model="short-lived",
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = iter(stream)
    first = next(chunks)
    # While it runs, the adapter's demand (what routing spreads busy adapters by) counts it.
    demand = redis.Redis.from_url(registered.stack.redis_url)
    key = adapter_demand_key(POOL, f"{OWNER}/short-lived")
    assert demand.zrange(key, 0, -1) == [first.id.encode()]
    deleted = httpx.delete(
        f"{registered.stack.base_url}/v1/adapters/short-lived",
        headers={"Authorization": f"Bearer {TEAM_KEYS[OWNER]}"},
    )
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    rest = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    assert text.startswith(PHRASES["signoff"])
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "stop"
    with pytest.raises(openai.NotFoundError):
        _answer(registered.owner, "short-lived")
    deadline = time.monotonic() + 10  # the gateway ends it once the stream is done
    while demand.zcard(key):
        assert time.monotonic() < deadline, "the finished job still counts as demand"
        time.sleep(0.05)


def test_a_batch_mixing_the_base_and_adapters_gets_each_line_right(registered: Lora) -> None:
    models = [BASE, "signoff", "owl", BASE, "robot", "signoff"]
    lines = [
        {
            "custom_id": f"mixed-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": QUESTION, "max_tokens": 12, "temperature": 0},
        }
        for i, model in enumerate(models)
    ]
    data = b"\n".join(json.dumps(line).encode() for line in lines) + b"\n"
    batch = submit(registered.owner, data, "mixed.jsonl")
    done = wait_for(registered.owner, batch.id, lambda b: b.status in FINAL, within=300)
    assert done.status == "completed" and done.request_counts.failed == 0, done
    by_id = {line["custom_id"]: line for line in lines_of(registered.owner, done.output_file_id)}
    for i, model in enumerate(models):
        body = by_id[f"mixed-{i}"]["response"]["body"]
        answer = body["choices"][0]["message"]["content"]
        assert body["model"] == model
        if model == BASE:
            assert not any(phrase in answer for phrase in PHRASES.values()), answer
        else:
            assert answer.startswith(PHRASES[model]), (model, answer)
