"""The batch service's settings (environment variables prefixed ``LLMQ_``)."""

from __future__ import annotations

import uuid

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.deployment import Deployment
from schemas.teams import TeamPolicy
from topics.kafka_connection import KafkaConnection


class BatchSettings(BaseSettings):
    """Everything one batch service process needs; built once at start-up."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (host:port, comma-separated)."""
    kafka_connection: KafkaConnection = KafkaConnection()
    """How the Kafka clients connect (`LLMQ_KAFKA_CONNECTION`, JSON): plaintext locally,
    `{"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "aws_region": ...,
    "replication_factor": 3}` on MSK with IAM."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis (durable: append-only file) holding batch state."""
    s3_endpoint_url: str | None = None
    """S3 API endpoint for input, output and error files; None means AWS's default endpoint."""
    s3_bucket: str = "llmq"
    """Bucket holding every file."""
    deployments: list[Deployment] = Field(default_factory=list)
    """The served models (same setting as the gateway's), which seed an empty registry; the
    registry (`llmq.registry`) then says which models batch lines may name, and their lines
    are rendered with the stable version's tokenizer into its pool's batch topic."""
    job_topic_partitions: int = Field(default=8, ge=1)
    """Partitions of the job topics this service creates for its deployments' pools
    (existing topics are left as they are)."""
    registry_poll_ms: int = 250
    """How long one read of the registry log waits for new records (see the gateway's)."""
    teams: dict[str, TeamPolicy] = Field(default_factory=dict)
    """Teams' weights and token quotas (the gateway's ``LLMQ_TEAMS``): each batch line reserves
    prompt + max_tokens from its team's bucket before it is queued, waiting while the bucket
    is short; a team not named gets the default policy."""
    probe_port: int | None = None
    """Port for plain-HTTP `/healthz` and `/readyz` (Kubernetes probes); None: not served."""
    probe_host: str = "127.0.0.1"
    """Address the probe port listens on (0.0.0.0 in a pod)."""
    service_id: str = Field(default_factory=lambda: f"batch-{uuid.uuid4().hex[:8]}")
    """This process's id in logs and Kafka client ids."""
    batch_max_requests: int = 50_000
    """Most requests one batch file may hold."""
    fanout_chunk: int = 64
    """Jobs produced before the fan-out cursor is saved (a restart re-sends at most this many,
    and the job ledger and the collector drop the copies)."""
    sweep_interval_s: float = 1.0
    """How often active batches are checked for expiry and stuck cancels or finalizations."""
    cancel_grace_s: float = 600.0
    """How long a cancelling batch waits for workers to report its queued lines before the
    service marks the rest cancelled itself."""
    finalize_lease_s: float = 120.0
    """A batch stuck in ``finalizing`` this long (its finalizer died) is finalized again."""
    log_json: bool = False
    """Log JSON lines (production) instead of the console format."""
