"""The one place that names every Kafka topic, consumer group and Redis channel or key."""

from __future__ import annotations

from typing import Literal

PriorityClass = Literal["interactive", "batch"]
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "batch")

USAGE_TOPIC = "llmq.usage"
"""One usage record per finished request, keyed by team."""

RESULTS_TOPIC = "llmq.results"
"""Finished batch lines, keyed by batch id (durable)."""

BATCHES_TOPIC = "llmq.batches"
"""Batch control events (a batch was created), keyed by batch id; the batch service fans out."""

BATCH_FANOUT_GROUP = "llmq.batch.fanout"
"""Consumer group of the batch services on the batch control topic."""

BATCH_COLLECTOR_GROUP = "llmq.batch.collector"
"""Consumer group of the batch services on the results topic."""

DEAD_TOPIC = "llmq.dead"
"""Jobs that cannot be processed, with the reason."""

REGISTRY_TOPIC = "llmq.registry"
"""Deployments, versions and traffic splits, keyed by deployment name; compacted (the latest
record of a name is its whole state) and one partition (one order over every name)."""

CANCEL_CHANNEL = "llmq:cancel"
WAKE_CHANNEL_PREFIX = "llmq:wake:"
"""`llmq:wake:{pool}`: a job was queued for the pool (its idle workers fetch now)."""
"""Redis pub/sub channel on which gateways announce cancelled requests."""

REPLICA_INDEX_KEY = "llmq:replicas"
"""Redis sorted set of replica ids (score: when the latest heartbeat expires, ms): how the
heartbeats are found without scanning the keyspace, which holds a key per recent job."""


def job_topic(pool: str, priority: PriorityClass) -> str:
    """Jobs for one pool and one priority class."""
    return f"llmq.jobs.{pool}.{priority}"


def worker_group(pool: str) -> str:
    """The consumer group shared by every worker of a pool."""
    return f"llmq.workers.{pool}"


QUOTA_GROUP = "llmq.gateways.quota"
"""Consumer group of every gateway's quota reconciler on the usage topic."""


def reply_channel(gateway_id: str) -> str:
    """Redis pub/sub channel carrying token events for every request one gateway holds."""
    return f"llmq:reply:{gateway_id}"


def is_reply_channel(name: str) -> bool:
    """Whether `name` is a gateway's reply channel (not, e.g., the results topic)."""
    return name.startswith("llmq:reply:")


def wake_channel(pool: str) -> str:
    return f"{WAKE_CHANNEL_PREFIX}{pool}"


def cancel_key(request_id: str) -> str:
    """Redis key (with a TTL) marking a request as cancelled, for jobs not yet fetched."""
    return f"llmq:cancel:{request_id}"


def done_key(request_id: str) -> str:
    """Redis key (with a TTL) marking a request as finished, so redeliveries are skipped."""
    return f"llmq:done:{request_id}"


def attempt_key(request_id: str, replay_id: str | None = None) -> str:
    """Redis hash (with a TTL) counting one job's runs and what they streamed; a replay
    counts its runs apart from the original's."""
    suffix = f":{replay_id}" if replay_id else ""
    return f"llmq:attempt:{request_id}{suffix}"


def backlog_key(pool: str, tier: PriorityClass) -> str:
    """Redis counter of queued (not yet started) prompt tokens for one pool and class."""
    return f"llmq:backlog:{pool}:{tier}"


def team_backlogs_key(pool: str, tier: PriorityClass) -> str:
    """Redis hash of backlog units per team (field) in one pool and class: queued prompts
    plus the slot shares of queued and running jobs (`InferenceJob.queue_units`)."""
    return f"llmq:backlog:{pool}:{tier}:teams"


def adapter_demand_key(pool: str, adapter: str) -> str:
    """Redis sorted set of one LoRA adapter's outstanding jobs in a pool (queued or running):
    request ids scored by their deadlines, so a job whose end was never recorded leaves it
    at its deadline."""
    return f"llmq:adapter-demand:{pool}:{adapter}"


def team_waiting_key(pool: str, tier: PriorityClass) -> str:
    """Redis hash of waiting prompt tokens per team (field) in one pool and class: admitted,
    not started on any worker (no slot shares: a running job waits for nothing)."""
    return f"llmq:backlog:{pool}:{tier}:waiting"


def slot_freed_key(request_id: str, replay_id: str | None = None) -> str:
    """Redis flag (with a TTL): one job's slot share has been uncounted, so the other runs
    and ends that reach it uncount nothing; a replay (queued, so counted, anew) has its own."""
    suffix = f":{replay_id}" if replay_id else ""
    return f"llmq:slot-freed:{request_id}{suffix}"


def bucket_key(team: str) -> str:
    """Redis hash holding one team's token bucket (tokens, last refill in ms)."""
    return f"llmq:bucket:{team}"


def replica_key(replica_id: str) -> str:
    """Redis key (with a TTL) holding a worker's latest heartbeat."""
    return f"llmq:replica:{replica_id}"


def batch_key(batch_id: str) -> str:
    """Redis hash with one batch's state (status, timestamps, counts, fan-out cursor)."""
    return f"llmq:batch:{batch_id}"


def batch_lines_key(batch_id: str) -> str:
    """Redis hash of one batch's recorded lines: line index -> result line (JSON)."""
    return f"llmq:batch:{batch_id}:lines"


def team_batches_key(team: str) -> str:
    """Redis sorted set of one team's batch ids, scored by creation time."""
    return f"llmq:batches:team:{team}"


ACTIVE_BATCHES_KEY = "llmq:batches:active"
"""Redis set of batches not yet in a final status (the batch service sweeps them)."""


def batch_cancel_key(batch_id: str) -> str:
    """Redis key marking a batch as cancelled, so workers drop its queued lines."""
    return f"llmq:batch:{batch_id}:cancelled"


def all_topics(pools: list[str]) -> list[str]:
    """Every Kafka topic the given pools need."""
    jobs = [job_topic(pool, cls) for pool in pools for cls in PRIORITY_CLASSES]
    return [*jobs, USAGE_TOPIC, RESULTS_TOPIC, BATCHES_TOPIC, DEAD_TOPIC]
