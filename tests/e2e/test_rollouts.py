"""Rollouts on the real engine, through the OpenAI SDK: the pool controller runs each
version's vLLM workers; a 20% canary takes 20 +- 5% of 300 requests by `system_fingerprint`,
the usage records account each to its version and arm, callers keep their arm, `:rollback`
holds for every request after it; promote, drain and a scale from 1 to 2 workers and back
happen under steady load with 0 failed, 0 interrupted, 0 lost and 0 duplicated requests
(the chaos benchmark's tallies, against the usage topic)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmq import services, starters
from llmq.bench.chaos import ChaosSettings, send_request, usage_counts
from llmq.bench.chaos_model import ChaosRequest, tally
from llmq.engine_env import engine_environment
from schemas.messages import UsageRecord
from tests.e2e.conftest import ADMIN_KEY, MAX_MODEL_LEN, Stack
from tests.polling import eventually
from topics import catalog
from topics.kafka_replay import KafkaTopicReader

pytestmark = pytest.mark.e2e

NAME = "tiny-rollout"
LENIENT = {"max_ttft_p95_ratio": 100.0, "max_tpot_p95_ratio": 100.0}
"""These tests hold the split themselves: the rollout controller must not roll a canary back
because its engine shares a core with the stack (measured: TTFT p95 1.67x the stable's)."""
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def controller(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A pool controller of the module's own deployment, seeded with version 1 (one real
    vLLM worker); stopping it drains and stops every worker it runs."""
    logs = tmp_path_factory.mktemp("rollouts")
    seed = [{"name": NAME, "path": str(stack.model_path), "pool": "rollout-1",
             "max_model_len": MAX_MODEL_LEN, "ttft_slo_s": 30,
             "replicas": {"min": 1, "max": 2}}]  # fmt: skip
    worker_env = {
        "LLMQ_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "LLMQ_REDIS_URL": stack.redis_url,
        **engine_environment(kv_cache_gib=1.0),
        "LLMQ_MAX_NUM_SEQS": "8",
        "LLMQ_KV_CACHE_GIB": "1",
        "LLMQ_DRAIN_GRACE_S": "60",
    }
    env = {
        "LLMQ_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "LLMQ_REDIS_URL": stack.redis_url,
        "LLMQ_DEPLOYMENTS": json.dumps(seed),
        "LLMQ_REGISTRY_POLL_MS": "50",
        "LLMQ_WORKER_ENV": json.dumps(worker_env),
        "LLMQ_WORKER_LOG_DIR": str(logs),
        "LLMQ_MANAGED_DEPLOYMENTS": json.dumps([NAME]),
        "LLMQ_RECONCILE_INTERVAL_S": "0.5",
        "LLMQ_JOB_TOPIC_PARTITIONS": "2",
    }
    process = starters.start_llmq("controller", env, logs / "controller.log")
    try:
        asyncio.run(_wait_state(stack, "1", "ready", 1))
        yield
    finally:
        services.stop(process, timeout=180)


def _admin(stack: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"{stack.base_url}/v1", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )  # fmt: skip


async def _versions(stack: Stack) -> dict[str, tuple[str, int]]:
    async with _admin(stack) as admin:
        response = await admin.get(f"/deployments/{NAME}")
    if response.status_code == 404:
        return {}
    return {v["version"]: (v["state"], v["ready_replicas"]) for v in response.json()["versions"]}


async def _wait_state(stack: Stack, version: str, state: str, ready: int) -> None:
    await eventually(
        lambda: _versions(stack),
        lambda v: v.get(version) == (state, ready),
        within=600,
        interval=0.5,
    )


async def _admin_call(stack: Stack, method: str, path: str, body: Any = None) -> dict[str, Any]:
    async with _admin(stack) as admin:
        response = await admin.request(method, f"/deployments/{NAME}{path}", json=body)
    assert response.status_code in (200, 201), response.text
    result: dict[str, Any] = response.json()
    return result


async def _register(stack: Stack, version: str) -> None:
    spec = {"version": version, "path": str(stack.model_path), "pool": f"rollout-{version}",
            "max_model_len": MAX_MODEL_LEN, "ttft_slo_s": 30,
            "replicas": {"min": 1, "max": 2}}  # fmt: skip
    await _admin_call(stack, "PUT", "", spec)
    await _wait_state(stack, version, "ready", 1)


async def _usage_arms(stack: Stack, since: float, until: float) -> Counter[tuple[str, str]]:
    """(version, arm) of the deployment's usage records in a time range."""
    arms: Counter[tuple[str, str]] = Counter()
    async with KafkaTopicReader(stack.kafka_bootstrap, client_id="e2e-usage") as reader:
        await reader.open(catalog.USAGE_TOPIC, since=since, until=until)
        async for record in reader.records():
            usage = UsageRecord.model_validate_json(record.value)
            if usage.model == NAME:
                arms[(usage.model_version or "-", usage.arm or "-")] += 1
    return arms


async def _served(client: openai.AsyncOpenAI, users: range) -> Counter[str]:
    """`system_fingerprint`s of one request per user, four at a time."""
    gate = asyncio.Semaphore(4)

    async def one(i: int) -> str:
        async with gate:
            reply = await client.chat.completions.create(
                model=NAME,
                messages=HI,
                max_tokens=1,
                user=f"caller-{i}",
            )
            return reply.system_fingerprint or "-"

    return Counter(await asyncio.gather(*(one(i) for i in users)))


@pytest.fixture
async def aclient(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=300
    )
    yield client
    await client.close()


async def test_a_20_percent_canary_takes_its_share_and_a_rollback_holds_at_once(
    stack: Stack, controller: None, aclient: openai.AsyncOpenAI
) -> None:
    await _register(stack, "2")
    await _admin_call(stack, "POST", ":canary", {"version": "2", "percent": 20, "policy": LENIENT})
    started = time.time()
    split = await _served(aclient, range(300))
    assert set(split) == {f"{NAME}@1", f"{NAME}@2"}
    assert 45 <= split[f"{NAME}@2"] <= 75, split  # 20 +- 5% of 300
    audit = await eventually(  # usage records follow the answers by milliseconds
        lambda: _usage_arms(stack, started - 1, time.time() + 1),
        lambda arms: sum(arms.values()) >= 300,
        within=60,
        interval=0.5,
    )
    assert audit == Counter(
        {("1", "stable"): split[f"{NAME}@1"], ("2", "canary"): split[f"{NAME}@2"]}
    )
    assert await _served(aclient, range(300)) == split  # sticky: each caller kept its arm
    await _admin_call(stack, "POST", ":rollback")
    after = await _served(aclient, range(300))  # every request after it: the stable version
    assert after == Counter({f"{NAME}@1": 300}), after
    await _wait_state(stack, "2", "retired", 0)


async def test_promote_drain_and_scale_under_steady_load_lose_nothing(
    stack: Stack, controller: None, aclient: openai.AsyncOpenAI
) -> None:
    load = ChaosSettings(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, model=NAME, max_tokens=8,
        stream_share=0.7, batch_share=0.0, kafka_bootstrap=stack.kafka_bootstrap, settle_s=60,
    )  # fmt: skip
    requests: list[ChaosRequest] = []
    tasks: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    since = time.time() - 1.0

    async def steady() -> None:
        while not stop.is_set():
            request = ChaosRequest(len(requests), len(requests) % 10 < 7, "interactive", 0.0)
            requests.append(request)
            tasks.append(asyncio.create_task(send_request(aclient, load, request)))
            await asyncio.sleep(0.5)  # the load's pace: two requests a second

    sender = asyncio.create_task(steady())
    try:
        await _register(stack, "3")
        await _admin_call(
            stack, "POST", ":canary", {"version": "3", "percent": 50, "policy": LENIENT}
        )
        promoted = await _admin_call(stack, "POST", ":promote")
        assert promoted["traffic"] == {
            "stable": "3", "canary": None, "canary_percent": 0.0, "rollout": None,
        }  # fmt: skip
        await _wait_state(stack, "1", "retired", 0)  # drained under load
        for replicas in (2, 1):
            bounds = {"min": replicas, "max": 2}
            await _admin_call(stack, "PATCH", "", {"version": "3", "replicas": bounds})
            await _wait_state(stack, "3", "ready", replicas)
    finally:
        stop.set()
        await sender
        await asyncio.gather(*tasks)
    accepted = {r.request_id for r in requests if r.request_id and r.outcome != "refused"}
    figures = tally(requests, await usage_counts(load, since, accepted), {})
    assert figures.sent >= 20
    assert (figures.failed, figures.interrupted, figures.lost, figures.duplicated) == (
        0,
        0,
        0,
        0,
    ), figures.lines()
    assert figures.refused == 0, figures.lines()
    served = Counter(r.served_by for r in requests)
    assert served[f"{NAME}@3"] and served[f"{NAME}@1"], served
