"""The gateway process's settings (environment variables prefixed ``LLMQ_``)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.services.quota import TeamPolicy
from schemas.deployment import Deployment
from topics.kafka_connection import KafkaConnection

__all__ = ["Deployment", "GatewaySettings"]


class GatewaySettings(BaseSettings):
    """Everything one gateway process needs; built once at start-up."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (host:port, comma-separated)."""
    kafka_connection: KafkaConnection = KafkaConnection()
    """How the Kafka clients connect (`LLMQ_KAFKA_CONNECTION`, JSON): plaintext locally,
    `{"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "aws_region": ...,
    "replication_factor": 3}` on MSK with IAM."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis (or Valkey) for the token relay, cancels and heartbeats."""
    redis_max_connections: int = 128
    """Redis connections of this gateway (the pub/sub relay holds one of them)."""
    s3_endpoint_url: str | None = None
    """S3 API endpoint for files and batches; None means AWS's default endpoint."""
    s3_bucket: str = "llmq"
    """S3 bucket of uploaded files (created at start-up when missing)."""
    adapter_uri_prefix: str | None = None
    """Where teams' LoRA adapters must be (`s3://bucket/adapters/{team}/`: `{team}` becomes
    the owning team), so a team can point registration only at its own prefix, not at any
    object the platform's credentials can read. None: any `s3://` URI (development)."""
    files_max_bytes: int = 200 * 1024**2
    """Largest file `POST /v1/files` accepts (413 beyond); uploads are streamed, not held."""
    batch_completion_window_s: int = 86_400
    """How long the `24h` completion window of a batch lasts, in seconds (tests shorten it)."""
    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    port: int = 8000
    """Port the HTTP server binds."""
    gateway_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    """This process's id; names its reply channel. Unique per process."""
    deployments: list[Deployment] = []
    """Served models (JSON list) that seed an empty registry: each becomes version "1" of its
    name unless the registry (`llmq.registry`) already has that name, which then wins. The
    first is the default model checked by /readyz."""
    admin_keys: list[str] = []
    """Bearer keys of operators (JSON list), for the admin API (`/v1/deployments`), for
    development; held only as SHA-256. They are not team keys: they cannot send requests."""
    admin_key_sha256: list[str] = []
    """SHA-256 hashes of admin keys (production)."""
    job_topic_partitions: int = 8
    """Partitions of the job topics this gateway creates for a pool that a newly registered
    deployment version names (existing topics are left as they are)."""
    registry_poll_ms: int = 250
    """How long one read of the registry log waits for new records. Kafka answers as soon as
    a record arrives; the local broker answers when the wait ends (the delay until a change
    made through another gateway is seen here)."""
    api_keys: dict[str, str] = {"sk-llmq-dev": "dev"}
    """Bearer API key -> team (JSON object), for development. Keys are kept only as SHA-256
    hashes in memory; production configures `teams` with key hashes instead."""
    teams: dict[str, TeamPolicy] = {}
    """Team -> weight, tokens per minute and SHA-256 hashes of its keys (JSON object). Teams
    not listed get the default policy."""
    admission_overhead_s: float = 0.05
    """Where the learnt overhead of the predicted TTFT starts (queue hops, first step)."""
    admission_quantile: float = 0.95
    """Admit an interactive request when this percentile of its predicted TTFT meets the SLO
    (from the measured spread of earlier predictions); 0.5 admits on the typical one."""
    fallback_prefill_tokens_per_s: float = 2000.0
    """Prefill rate assumed for a pool whose workers have not measured one yet."""
    routing: Literal["affinity", "random"] = "affinity"
    """How the partition (so the worker) is chosen: prefix affinity with bounded load, or
    random (the broker's default partitioner; for comparisons)."""
    routing_prefix_blocks: int = 4
    """Leading prompt blocks hashed to choose the partition (prefix-cache affinity)."""
    routing_block_size: int = 128
    """Tokens per block in that hash; match the engine's KV block size (128 on the CPU)."""
    routing_load_factor: float = 1.25
    """A partition whose owner is above this times the pool's mean load is walked past."""
    routing_adapter_jobs_per_replica: int = Field(default=4, ge=1)
    """The fewest outstanding jobs of one LoRA adapter per worker it spreads over: a busy
    adapter spreads by its share of the pool's jobs, never thinner than this per worker."""
    produce_timeout_s: float = 5.0
    """How long a job may wait for the broker's acknowledgement before the caller gets 503
    (a broker that is down must not hold requests for the producer's own 40 s timeout)."""
    request_timeout_s: float = 600.0
    """Deadline of an interactive request, from arrival to its last token."""
    replica_refresh_s: float = 0.1
    """How often the gateway re-reads replica heartbeats (as often as workers refresh them:
    their slot ends age quickly)."""
    topic_watch_interval_s: float = Field(default=5.0, ge=0)
    """How often the gateway reads the job topics' lag and the dead-letter topic (for
    `/metrics` and `/admin`); 0: never."""
    max_request_bytes: int | None = None
    """Largest request body the API accepts outside file uploads (413 beyond, refused before
    it is parsed, with or without a Content-Length). None: 1 MiB plus 32 bytes per token of
    the largest `max_model_len` among the deployments (far above any tokenizer's average of
    4-12 JSON bytes per token), so every request that can fit a context fits the limit."""
    render_threads: int = 2
    """Threads that parse large bodies, apply chat templates and tokenize, off the event loop;
    more requests wait for a free thread (they cost their own latency, not everyone's)."""
    header_timeout_s: float = 10.0
    """A connection must deliver a request's line and headers within this many seconds of
    opening (or of its previous response, on a kept-alive connection), else it is closed."""
    body_timeout_s: float = 30.0
    """A JSON request's whole body must arrive within this many seconds of its headers (408
    otherwise); an upload is cut off when no byte of it arrives for this long."""
    keep_alive_timeout_s: float = 5.0
    """An idle kept-alive connection is closed after this many seconds."""
    max_connections: int = 2048
    """Open connections (and requests in progress) this process serves at once; beyond,
    new requests get 503 (uvicorn's ``limit_concurrency``)."""
    max_connections_per_client: int = 256
    """Open connections from one client address; more are closed at once (0: no limit). Behind
    a load balancer every client shares its address: raise this or set 0."""
    auth_failures_allowed: int = 10
    """Failed authentications one client address may make per `auth_failure_window_s`; beyond,
    its requests get 429 until the window passes (per gateway process)."""
    auth_failure_window_s: float = 60.0
    """The window over which failed authentications are counted."""
    log_json: bool = False
    """JSON logs (production) instead of console logs (development)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The least severe log events written (DEBUG adds why each held job waits)."""
