"""The worker process's settings (environment variables prefixed ``LLMQ_``)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from topics.kafka_connection import KafkaConnection


class WorkerSettings(BaseSettings):
    """Everything one worker (one engine replica) needs; built once at start-up."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (host:port, comma-separated)."""
    kafka_connection: KafkaConnection = KafkaConnection()
    """How the Kafka clients connect (`LLMQ_KAFKA_CONNECTION`, JSON): plaintext locally,
    `{"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "aws_region": ...,
    "replication_factor": 3}` on MSK with IAM."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis (or Valkey) for the token relay, cancels and heartbeats."""
    model: str = "smollm2-135m-instruct"
    """The model name this worker serves (what callers put in `model`)."""
    model_path: str = ""
    """Folder with the model's weights, config and tokenizer."""
    weights_uri: str | None = None
    """Where the weights are (`s3://bucket/prefix`, a whole model folder: config, tokenizer
    and weights); the engine then loads their verified copy in `weights_cache_dir` instead of
    `model_path`. None: `model_path` holds them. The controller sets it from the version."""
    weights_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The weights' digest (`llmq weights digest`); required with `weights_uri`, and checked
    on `model_path` when set without it. Weights that do not match are never served: the
    worker exits with code 4."""
    weights_cache_dir: str = ".llmq/weights"
    """This node's cache of weights fetched from `weights_uri` (one folder per sha256),
    shared by its workers: the first downloads and verifies, the others reuse."""
    s3_endpoint_url: str | None = None
    """S3 API endpoint for `weights_uri` (the gateway's and batch's setting of that name);
    None means AWS's default endpoint."""
    engine: Literal["vllm", "simulated"] = "vllm"
    """What runs the jobs: ``vllm`` (the real engine on `model_path`), or ``simulated``: a
    SIMULATED GPU replica (`sim_gpu` x `sim_tensor_parallel` serving `sim_model`, step times
    from a roofline model, placeholder text) that drives the whole real platform at GPU speed
    on a machine without one. A simulated worker says so in its heartbeat and logs."""
    sim_gpu: Literal["h100", "h200"] = "h100"
    """Simulated engine only: the accelerator it models."""
    sim_model: Literal["llama-3-8b", "llama-3-70b"] = "llama-3-8b"
    """Simulated engine only: the model whose weight reads, FLOPs and KV size it models."""
    sim_tensor_parallel: int = 1
    """Simulated engine only: GPUs per replica."""
    sim_time_scale: float = 1.0
    """Simulated engine only: simulated seconds per wall-clock second (1: real time)."""
    pool: str = "smollm2"
    """The pool this replica belongs to; it consumes that pool's job topics."""
    replica_id: str = Field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:8]}")
    """This replica's id in heartbeats and logs."""
    max_num_seqs: int = 16
    """Most sequences the engine runs at once; the pull loop never holds more jobs."""
    tpot_slo_s: float | None = Field(default=None, gt=0)
    """The decode step time (seconds per output token) the worker keeps under by running
    fewer sequences: it learns step time from batch size and context, and starts no job
    beyond the largest batch predicted to stay within this (with a 10% margin; running jobs
    are never preempted for it); its heartbeat reports that cap as its slots. None: no cap
    beyond max_num_seqs."""
    max_model_len: int = 2048
    """Prompt plus output tokens per request."""
    max_lora_rank: int = Field(default=0, ge=0)
    """The largest LoRA rank this worker's engine applies; 0 runs no LoRA (requests naming an
    adapter fail). The deployment sets it (`engine_args.max_lora_rank`), which is also what
    lets teams register adapters of it."""
    max_loras: int = Field(default=4, ge=1)
    """LoRA adapters one engine step mixes (vLLM's max_loras): requests of more adapters
    wait for a slot."""
    max_cpu_loras: int | None = Field(default=None, ge=1)
    """Adapters kept loaded in host memory, least recently used evicted first (vLLM's
    max_cpu_loras; None: max_loras). An evicted adapter reloads from the node's disk cache."""
    kv_cache_gib: float = 1.0
    """KV cache size on the CPU engine, any fraction of a GiB (vLLM's kv_cache_memory_bytes);
    GPUs size it themselves."""
    dtype: str = "bfloat16"
    """Weights and activations precision."""
    batch_kv_watermark: float = 0.70
    """Batch jobs start only while the KV cache is used below this fraction."""
    batch_max_in_flight: int | None = None
    """Most batch jobs running at once (None: no cap beyond max_num_seqs). Set it low on CPU
    engines, where every running sequence slows every step."""
    team_slot_reserve: int = 1
    """Sequence slots kept free for a team holding no job on this worker, so its first request
    never waits for another team's jobs to end (only when max_num_seqs > 2x this)."""
    light_burst_sigmas: float = Field(default=3.0, ge=0)
    """Slots a flooding team leaves a steady one: the steady team's average use plus this many
    standard deviations of a Poisson count with that mean. 3: its requests find a slot about
    99.5% of the time, so slot waits take little of its TTFT p95's 5%; 2 leaves the flood
    about one slot more, and some 3% of the steady team's requests wait for one."""
    team_usage_window_s: float = 30.0
    """How far back a worker looks to tell a steady team from a flooding one (the window of
    its moving averages of slots held and time spent waiting); a team new to the worker
    counts as flooding for the first third of it."""
    fair_lookahead: int = 4
    """Interactive jobs held beyond what can start (one per partition at most), so the
    weighted fair queue can choose between teams when a slot frees. Uncommitted: a crash
    re-delivers them."""
    idle_fetch_interval_s: float = Field(default=0.5, ge=0, le=60)
    """A worker that has fetched everything in its partitions (empty fetches for three rounds
    of `fetch_max_wait_ms` since the last announcement) stops polling the broker, idle or
    busy: it fetches again when a gateway (or the batch service, `llmq replay`, a worker
    re-queuing) announces a job for its pool over Redis pub/sub, and at least this often: a
    job whose announcement was lost (Redis away) waits up to this long. 0: always poll every
    `fetch_max_wait_ms`. At most 60 s, well inside the consumer's `max_poll_interval_ms`."""
    fetch_max_wait_ms: int = Field(default=10, ge=1, le=5_000)
    """How long a fetch of job records waits on the broker for records to arrive. Kafka (and
    MSK) answer a waiting fetch as soon as records arrive, so set 500 there: an idle worker
    then polls twice a second instead of a hundred times. The local broker (Tansu) answers
    only when the wait expires, so it keeps 10 (the produce-to-start delay)."""
    heartbeat_interval_s: float = 0.1
    """How often the heartbeat is refreshed in Redis. Its slot ends feed admission's TTFT
    prediction, and a stale one is its largest error: at the knee on simulated workers
    (README) the error's p50 was 28% at 0.5 s and 10% at 0.2 s or 0.1 s, its p95 49% at
    0.2 s and 38% at 0.1 s, for no more CPU per streamed token."""
    heartbeat_ttl_s: float = 3.0
    """How long a heartbeat lives; a replica silent for longer is treated as gone."""
    probe_port: int | None = None
    """Port for plain-HTTP `/healthz` and `/readyz` (Kubernetes probes); None: not served."""
    probe_host: str = "127.0.0.1"
    """Address the probe port listens on (0.0.0.0 in a pod)."""
    health_probe_interval_s: float = 5.0
    """How often the worker runs a one-token generation to prove the engine works (0: off)."""
    health_probe_timeout_s: float = 10.0
    """How long a probe generation may take before it counts as failed."""
    health_failures_allowed: int = 2
    """Failed probes in a row that make the worker unhealthy: it stops, exits non-zero."""
    watchdog_stall_s: float = 30.0
    """The engine holding jobs but producing nothing for this long is a hang: same exit."""
    max_failed_runs: int = 2
    """A job whose runs ended without an outcome this many times (its worker died, or the
    engine raised before its caller saw a token) goes to the dead-letter topic instead of
    running again, so one poison request cannot take down worker after worker."""
    done_ttl_s: int = 7 * 86_400
    """How long finished request ids are remembered, so redeliveries and replays of them are
    skipped (match the job topics' retention)."""
    drain_grace_s: float = 60.0
    """On SIGTERM, how long in-flight requests may run before they are aborted."""
    log_json: bool = False
    """JSON logs (production) instead of console logs (development)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The least severe log events written (DEBUG adds why each held job waits)."""
    frontend_cores: list[int] = []
    """CPU cores this worker's own threads and its engine's non-compute threads move to once
    the engine runs (JSON list; empty: they stay where they start). For a CPU engine whose
    compute threads are bound to other cores (`VLLM_CPU_OMP_THREADS_BIND`): the pull loop,
    token relay and detokenizing then never take the engine's core."""
