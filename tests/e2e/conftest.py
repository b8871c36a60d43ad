"""The whole stack for e2e tests: Tansu, Valkey, one real vLLM worker on the tiny model, and
the gateway, each a real process on free loopback ports, started once per session."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from llmq import services, starters
from llmq.engine_env import engine_environment
from llmq.modelbuild import ensure_model
from topics.kafka import ensure_topics

MODEL = "tiny-llama"
POOL = "tiny"
API_KEY = "sk-e2e-test"
SMALL_TEAM_KEY = "sk-e2e-small-team"
SMALL_TEAM_TOKENS_PER_MINUTE = 200
TEAM_KEYS = {"team-a": "sk-e2e-team-a", "team-b": "sk-e2e-team-b",
             "team-c": "sk-e2e-team-c", "team-d": "sk-e2e-team-d"}  # fmt: skip
"""Teams for isolation tests: a and b have caches of their own, c and d share one on MODEL."""
SHARED_CACHE_TEAMS = {"company": ["team-c", "team-d"]}
FUZZ_KEY = "sk-e2e-fuzz"
ADMIN_KEY = "sk-e2e-admin"
"""The schema fuzzer's team: whatever it spends or queues is not another test's."""
STRICT_MODEL = "tiny-llama-strict"
"""The same pool as MODEL, with a TTFT SLO no queue can meet: any backlog sheds requests."""
MAX_MODEL_LEN = 2048
SIM_MODEL = "sim-llama-3-8b"
"""A pool served by a SIMULATED GPU worker (placeholder text, tiny-llama's tokenizer)."""
SIM_POOL = "sim"
IDLE_MODEL = "tiny-llama-idle"
"""A model whose pool has no worker: its jobs wait in the queue (for expiry and cancel tests)."""
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "e2e",
    "AWS_SECRET_ACCESS_KEY": "e2e",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Processes:
    """The stack's llmq processes, each restartable with the same settings (and port)."""

    logs: Path
    specs: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    running: dict[str, services.ManagedProcess] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    def start(self, name: str, kind: str, env: dict[str, str]) -> services.ManagedProcess:
        self.specs[name] = (kind, env)
        return self._spawn(name)

    def _spawn(self, name: str) -> services.ManagedProcess:
        kind, env = self.specs[name]
        self.starts[name] = self.starts.get(name, 0) + 1
        log_path = self.logs / f"{name}-{self.starts[name]}.log"
        proc = starters.start_llmq(kind, env, log_path, name=name)  # type: ignore[arg-type]
        self.running[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or an OOM kill would: no drain, no goodbye."""
        proc = self.running.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        services.stop(proc, timeout=10)

    def restart(self, name: str) -> services.ManagedProcess:
        return self._spawn(name)

    def stop_all(self) -> None:
        for name in list(self.running):
            services.stop(self.running.pop(name), timeout=30)


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
    processes: Processes
    s3_endpoint: str
    gateway_env: dict[str, str]
    probe_ports: dict[str, int] = field(default_factory=dict)
    """Plain-HTTP /healthz and /readyz ports of the worker and the batch service."""

    def wait_ready(self, base_url: str | None = None) -> None:
        url = f"{base_url or self.base_url}/readyz"
        services.wait_ready(
            lambda: services.http_status(url) == 200,
            timeout=120,
            watch=list(self.processes.running.values()),
            what=url,
        )


@pytest.fixture(scope="session")
def stack(
    kafka_bootstrap: str, redis_url: str, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    import asyncio

    model_path = ensure_model(MODEL)
    asyncio.run(ensure_topics(kafka_bootstrap, [POOL], partitions=4))
    logs = tmp_path_factory.mktemp("stack")
    probe_ports = {"worker": services.free_port(), "batch": services.free_port()}
    common = {"LLMQ_KAFKA_BOOTSTRAP": kafka_bootstrap, "LLMQ_REDIS_URL": redis_url}
    asyncio.run(ensure_topics(kafka_bootstrap, ["idle", SIM_POOL], partitions=2))
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
        "LLMQ_PROBE_PORT": str(probe_ports["worker"]),
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
                    "shared_cache_teams": SHARED_CACHE_TEAMS,
                    "tool_call_parser": "hermes",
                },
                {
                    "name": STRICT_MODEL,
                    "path": str(model_path),
                    "pool": POOL,
                    "max_model_len": MAX_MODEL_LEN,
                    "ttft_slo_s": 0.001,
                },
                {
                    "name": SIM_MODEL,
                    "path": str(model_path),
                    "pool": SIM_POOL,
                    "max_model_len": MAX_MODEL_LEN,
                },
                {
                    "name": IDLE_MODEL,
                    "path": str(model_path),
                    "pool": "idle",
                    "max_model_len": MAX_MODEL_LEN,
                },
            ]
        ),
        "LLMQ_ADMIN_KEYS": json.dumps([ADMIN_KEY]),
        "LLMQ_S3_ENDPOINT_URL": s3_endpoint,
        "LLMQ_S3_BUCKET": "llmq-e2e",
        **S3_CREDENTIALS,
        "LLMQ_API_KEYS": json.dumps(
            {API_KEY: "e2e", FUZZ_KEY: "fuzz", **{k: t for t, k in TEAM_KEYS.items()}}
        ),
        "LLMQ_TEAMS": json.dumps(
            {
                "small": {
                    "tokens_per_minute": SMALL_TEAM_TOKENS_PER_MINUTE,
                    "key_sha256": [hashlib.sha256(SMALL_TEAM_KEY.encode()).hexdigest()],
                }
            }
        ),
    }
    processes = Processes(logs)
    base_url = f"http://{services.LOCALHOST}:{port}"
    try:
        worker = processes.start("worker", "worker", worker_env)
        sim_env = {
            **common,
            "LLMQ_ENGINE": "simulated",
            "LLMQ_SIM_MODEL": "llama-3-8b",
            "LLMQ_MODEL": SIM_MODEL,
            "LLMQ_POOL": SIM_POOL,
            "LLMQ_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
            "LLMQ_MAX_NUM_SEQS": "16",
            "LLMQ_REPLICA_ID": "e2e-sim-0",
        }
        processes.start("sim-worker", "worker", sim_env)
        gateway = processes.start("gateway", "gateway", gateway_env)
        batch_env = {**gateway_env, "LLMQ_SERVICE_ID": "e2e-batch"}
        processes.start(
            "batch", "batch", {**batch_env, "LLMQ_PROBE_PORT": str(probe_ports["batch"])}
        )
        services.wait_ready(
            lambda: services.http_status(f"{base_url}/readyz") == 200,
            timeout=600,
            watch=[worker, gateway],
            what="gateway /readyz",
        )
        yield Stack(
            base_url, API_KEY, MODEL, model_path, kafka_bootstrap, redis_url, POOL,
            MAX_MODEL_LEN, processes, s3_endpoint, gateway_env, probe_ports,
        )  # fmt: skip
    finally:
        processes.stop_all()


@pytest.fixture(scope="session")
def client(stack: Stack) -> openai.OpenAI:
    """The real OpenAI SDK, pointed at the gateway."""
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0)
