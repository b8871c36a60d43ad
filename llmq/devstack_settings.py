"""How the local stack is laid out: ``LLMQ_DEV_*`` environment variables."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmq.services import LOCALHOST


class DevStackSettings(BaseSettings):
    """How the local stack is laid out (environment variables ``LLMQ_DEV_*``)."""

    model_config = SettingsConfigDict(
        env_prefix="LLMQ_DEV_", use_attribute_docstrings=True, extra="ignore"
    )

    host: str = "127.0.0.1"
    """Address the gateway listens on."""
    port: int = 8000
    """Port the gateway listens on."""
    kafka_port: int = 9092
    """Port of the local Kafka-protocol broker (Tansu) on 127.0.0.1."""
    redis_port: int = 6379
    """Port of the local Valkey (Redis) server on 127.0.0.1."""
    s3_port: int = 9000
    """Port of the local S3-API server (moto) on 127.0.0.1."""
    model: str = "smollm2-135m-instruct"
    """Served model name; its folder is built under models_dir() on first use."""
    pool: str = "smollm2"
    """Worker pool of the model (names its job topics)."""
    second_model: str = "smollm2-135m-fast"
    """A second deployment, on the same weights, in a pool of its own (`second_pool`) with a
    shorter context, fewer sequences and a tighter TTFT SLO: two models in two pools, as a
    platform serves them (routing, quotas and batch lines per model). Empty: only `model`
    (one engine less on a small machine, e.g. for benchmarks)."""
    second_pool: str = "smollm2-fast"
    """Worker pool of the second model."""
    max_model_len: int = 2048
    """Longest prompt + completion the worker accepts, in tokens."""
    ttft_slo_s: float = Field(default=1.0, gt=0)
    """The first model's TTFT SLO, which admission refuses by; the second model gets half of
    it. Raise it on a machine where even a lone request misses 1 s, to see admission at work
    rather than refusing everything (a benchmark's ``--ttft-slo-s`` should then match)."""
    tpot_slo_s: float | None = Field(default=None, gt=0)
    """The first model's TPOT SLO (None: none). With one, its workers cap running sequences
    at the batch their learnt decode step time keeps within it, and admission counts only
    those slots (the second model gets the same)."""
    max_num_seqs: int = 16
    """Most sequences the worker's engine runs at once."""
    engine: Literal["vllm", "simulated"] = "vllm"
    """The workers' engine: ``vllm`` runs the real model on the CPU; ``simulated`` runs
    SIMULATED GPU replicas (placeholder text at GPU speed; ``LLMQ_SIM_*`` choose the GPU and
    model) so the platform's own path can be load-tested. The gateway still tokenizes with the
    real model's tokenizer."""
    health_probe_timeout_s: float = 30.0
    """How long the worker's probe generation may take. The CPU engine shares the machine with
    everything else on it: another engine (a benchmark's own vLLM server) starved it past the
    worker's 10 s default twice in a row, and the worker restarted itself mid-benchmark."""
    health_probe_interval_s: float = 30.0
    """How often an idle worker's probe generation runs (0: off). Every engine call keeps vLLM's
    worker spinning on its shared-memory queue for the next second (`busy_loop_s`), so the
    worker's 5 s default kept an idle CPU worker at about 20% of a core, taken from the engine's
    neighbours on a 2-core machine; at 30 s it is about 3%. A busy worker skips the probe."""
    tool_call_parser: str | None = "hermes"
    """How the model writes tool calls in text, for `tool_choice: "auto"` (None: refused)."""
    max_lora_rank: int = 8
    """The first model's workers run LoRA up to this rank (its `engine_args.max_lora_rank`),
    so teams can register adapters of it; 0 runs it without LoRA."""
    platform_cores: list[int] = []
    """CPU cores the stack's own processes run on (JSON list): the broker, Redis, the S3
    server, the gateway, the batch service and each worker's front end (its pull loop, token
    relay, detokenizing and its engine's scheduler process). The workers' CPU engines bind
    their compute threads to the other cores, one core each; the controller floats. Empty
    (the default): every process may run on every core. On a 2-core machine with one model,
    `[1]` keeps the platform's per-token work off the engine's core (as vLLM's CPU guide
    reserves cores for the serving front end); `llmq bench overhead` then gives its direct
    server the mirror layout."""
    kv_cache_gib: float = 1.0
    """KV-cache memory of the worker's engine, in GiB."""
    partitions: int = 8
    """Partitions of each job topic."""
    batch_max_in_flight: int = 2
    """Batch sequences one worker runs at once. The CPU engine is compute-bound (each running
    sequence lengthens every step), so the local stack keeps batch to a trickle beside
    interactive work; on GPUs leave the worker's default (no cap)."""
    workers: int = 1
    """Worker processes (engine replicas) in the pool; 2 shows partition routing at work."""
    admin_key: str = "sk-llmq-admin"
    """The gateway's admin key (the admin API: `llmq deployments ...`)."""
    api_key: str = "sk-llmq-dev"
    """The API key the local gateway accepts."""
    team: str = "dev"
    """Team the API key belongs to."""
    extra_api_keys: dict[str, str] = {}
    """More API keys -> teams (JSON), e.g. for `llmq bench load` with several teams."""
    ready_timeout_s: float = 600.0
    """Seconds to wait for the gateway's /readyz (the first start builds the model)."""
    log_json: bool = False
    """Whether the gateway and worker write JSON log lines instead of console lines."""

    @property
    def pools(self) -> list[str]:
        return [self.pool, self.second_pool] if self.second_model else [self.pool]

    @property
    def expected_workers(self) -> int:
        """Workers the stack runs: `workers` for the model, one for the second model."""
        return self.workers + (1 if self.second_model else 0)

    def engine_cores(self, available: Collection[int]) -> list[int] | None:
        """The cores the workers' engines are spread over: the `available` ones that are not
        `platform_cores` (None when that is empty: the controller's default, every core).
        ValueError when a platform core is not available or none is left for the engines."""
        if not self.platform_cores:
            return None
        missing = sorted(set(self.platform_cores) - set(available))
        if missing:
            raise ValueError(
                f"LLMQ_DEV_PLATFORM_CORES names cores this process cannot use: {missing} "
                f"(available: {sorted(available)})"
            )
        left = sorted(set(available) - set(self.platform_cores))
        if not left:
            raise ValueError(
                "LLMQ_DEV_PLATFORM_CORES takes every core: leave at least one for the engines"
            )
        return left

    @property
    def gateway_url(self) -> str:
        host = LOCALHOST if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"
