"""The whole stack for e2e tests: Tansu, Valkey, one real vLLM worker on the tiny model, and
the gateway, each a real process on free loopback ports, started once per session."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from llmq import services
from llmq.engine_env import engine_environment
from llmq.modelbuild import ensure_model
from topics.kafka import ensure_topics

MODEL = "tiny-llama"
POOL = "tiny"
API_KEY = "sk-e2e-test"
SMALL_TEAM_KEY = "sk-e2e-small-team"
SMALL_TEAM_TOKENS_PER_MINUTE = 200
STRICT_MODEL = "tiny-llama-strict"
"""The same pool as MODEL, with a TTFT SLO no queue can meet: any backlog sheds requests."""
MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class Stack:
    base_url: str
    api_key: str
    model: str
    model_path: Path
    kafka_bootstrap: str
    redis_url: str
    pool: str
    max_model_len: int


@pytest.fixture(scope="session")
def stack(
    kafka_bootstrap: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    import asyncio

    model_path = ensure_model(MODEL)
    asyncio.run(ensure_topics(kafka_bootstrap, [POOL], partitions=4))
    logs = tmp_path_factory.mktemp("stack")
    common = {"LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap, "LLMQ_REDIS_URL": redis_url}
    worker_env = {
        **common,
        **engine_environment(kv_cache_gib=1.0),
        "LLMQ_MODEL": MODEL,
        "LLMQ_MODEL_PATH": str(model_path),
        "LLMQ_POOL": POOL,
        "LLMQ_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "LLMQ_MAX_NUM_SEQS": "8",
        "LLMQ_KV_CACHE_GIB": "1",
        "LLMQ_REPLICA_ID": "e2e-worker-0",
        "LLMQ_DTYPE": "float32",
    }
    port = services.free_port()
    gateway_env = {
        **common,
        "LLMQ_HOST": services.LOCALHOST,
        "LLMQ_PORT": str(port),
        "LLMQ_DEPLOYMENTS": json.dumps(
            [
                {
                    "name": MODEL,
                    "path": str(model_path),
                    "pool": POOL,
                    "max_model_len": MAX_MODEL_LEN,
                },
                {
                    "name": STRICT_MODEL,
                    "path": str(model_path),
                    "pool": POOL,
                    "max_model_len": MAX_MODEL_LEN,
                    "ttft_slo_s": 0.001,
                },
            ]
        ),
        "LLMQ_API_KEYS": json.dumps({API_KEY: "e2e"}),
        "LLMQ_TEAMS": json.dumps(
            {
                "small": {
                    "tokens_per_minute": SMALL_TEAM_TOKENS_PER_MINUTE,
                    "key_sha256": [hashlib.sha256(SMALL_TEAM_KEY.encode()).hexdigest()],
                }
            }
        ),
    }
    worker = services.start_llmq("worker", worker_env, logs / "worker.log")
    gateway = services.start_llmq("gateway", gateway_env, logs / "gateway.log")
    base_url = f"http://{services.LOCALHOST}:{port}"
    try:
        services.wait_ready(
            lambda: services.http_status(f"{base_url}/readyz") == 200,
            timeout=600,
            watch=[worker, gateway],
            what="gateway /readyz",
        )
        yield Stack(
            base_url, API_KEY, MODEL, model_path, kafka_bootstrap, redis_url, POOL, MAX_MODEL_LEN
        )
    finally:
        services.stop(gateway)
        services.stop(worker, timeout=30)


@pytest.fixture(scope="session")
def client(stack: Stack) -> openai.OpenAI:
    """The real OpenAI SDK, pointed at the gateway."""
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
