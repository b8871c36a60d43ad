"""Prometheus metrics of the gateway: requests by status, TTFT, TPOT, end-to-end latency,
and each pool's replicas as their heartbeats report them (what autoscalers read)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.recent import RecentRequests
from gateway.services.topic_watch import TopicsSnapshot
from schemas.deployment import Deployment
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import InferenceJob, UsageCounts

PoolReplicas = Callable[[], Mapping[str, Sequence[ReplicaHeartbeat]]]
Topics = Callable[[], TopicsSnapshot | None]
"""The topic watcher's last snapshot (`TopicMonitor.snapshot`)."""
"""Live replicas by pool (`ReplicaView.by_pool`)."""
ServedModels = Callable[[], Sequence[Deployment]]
"""The stable version of every served deployment (`ModelRegistry.deployments`)."""

JOB_LABELS = ["model", "version", "team", "tier"]
"""What a served request's metrics are broken down by: all bounded (registered deployments
and versions, configured teams, two tiers); never a request id or a caller's free text."""
UNROUTED = "-"
"""The `model` label of a request refused before its model was found (a caller's unknown
model name is free text: it never becomes a label)."""


def job_labels(job: InferenceJob) -> tuple[str, str, str, str]:
    """`JOB_LABELS` of a job."""
    return (job.model, job.model_version or "", job.team, job.tier)


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.recent = RecentRequests()
        """The last minutes per model, for the operator page (`/admin`)."""
        self.requests = Counter(
            "llmq_requests",
            "Generation requests by model, version, team, tier and outcome (refused ones with "
            "their HTTP status and no version or tier).",
            [*JOB_LABELS, "status"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "llmq_refusals",
            "Requests refused before they were queued, by error code (429s: "
            "rate_limit_exceeded, the SLO admission's codes; 503s: queue or relay away).",
            ["model", "team", "status", "code"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "llmq_prompt_tokens",
            "Prompt tokens of finished requests, served from the prefix cache (hit) or not.",
            ["model", "version", "team", "cache"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "llmq_time_to_first_token_seconds",
            "Arrival to first token.",
            JOB_LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "llmq_time_per_output_token_seconds",
            "Mean gap between tokens after the first, per request.",
            JOB_LABELS,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
            registry=self.registry,
        )
        self.ttft_error = Histogram(
            "llmq_ttft_prediction_error_ratio",
            "Admission's predicted TTFT against the actual one: (predicted - actual) / actual "
            "(negative: the request waited longer than predicted).",
            ["model"],
            buckets=(-0.9, -0.5, -0.2, -0.1, 0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttft_abs_error = Histogram(
            "llmq_ttft_prediction_abs_error_ratio",
            "|predicted - actual| / actual of admission's TTFT prediction.",
            ["model"],
            buckets=(0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0),
            registry=self.registry,
        )
        self.ttft_calibration = Gauge(
            "llmq_ttft_calibration_factor",
            "What admission multiplies its raw TTFT predictions by, learnt per pool from the "
            "actual TTFTs (1: the raw model is right).",
            ["pool"],
            registry=self.registry,
        )
        self.adapter_requests = Counter(
            "llmq_adapter_requests",
            "Requests of teams' LoRA adapters by team, adapter, base model and outcome.",
            ["team", "adapter", "model", "status"],
            registry=self.registry,
        )
        self.adapter_tokens = Counter(
            "llmq_adapter_tokens",
            "Prompt and completion tokens of teams' LoRA adapters (completion: as relayed).",
            ["team", "adapter", "model", "kind"],
            registry=self.registry,
        )
        self.queue_time = Histogram(
            "llmq_queue_time_seconds",
            "Arrival to a worker starting the job (the worker's clock), of requests that finished.",
            JOB_LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "llmq_e2e_request_latency_seconds",
            "Arrival to last token.",
            JOB_LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def watch_replicas(self, replicas: PoolReplicas) -> None:
        """Export each pool's replicas (read at every scrape, never stale beyond a refresh)."""
        self.registry.register(PoolReplicaCollector(replicas))

    def watch_models(self, models: ServedModels) -> None:
        """Export each served model's SLOs (what dashboards draw the latencies against)."""
        self.registry.register(ModelSloCollector(models))

    def watch_topics(self, topics: Topics) -> None:
        """Export the job topics' lag and the dead letters held (the watcher's snapshot)."""
        self.registry.register(TopicCollector(topics))

    def watch_relay(self, relay: RelayState) -> None:
        """Export the token relay's subscription state and how often it was lost."""
        self.registry.register(RelayCollector(relay))

    def observe_prompt(self, labels: tuple[str, str, str, str], usage: UsageCounts) -> None:
        """Count a finished request's prompt tokens, cached (hit) and computed (miss)."""
        model, version, team, _ = labels
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        self.prompt_tokens.labels(model, version, team, "hit").inc(cached)
        self.prompt_tokens.labels(model, version, team, "miss").inc(usage.prompt_tokens - cached)

    def refused(self, model: str, team: str, status: int, code: str | None) -> None:
        """Count a request refused before it was queued (`model`: a served name or
        `UNROUTED`)."""
        self.requests.labels(model, "", team, "", str(status)).inc()
        self.refusals.labels(model, team, str(status), code or "").inc()

    def observe_adapter(self, job: InferenceJob, outcome: str, completion_tokens: int) -> None:
        """Count a finished request of a team's LoRA adapter: its outcome and its tokens.
        Adapters are registered names (the registry bounds them), so the labels stay few."""
        assert job.adapter is not None
        labels = (job.team, job.adapter.name, job.model)
        self.adapter_requests.labels(*labels, outcome).inc()
        self.adapter_tokens.labels(*labels, "prompt").inc(len(job.prompt_token_ids))
        self.adapter_tokens.labels(*labels, "completion").inc(completion_tokens)

    def observe_prediction(self, model: str, predicted_s: float, actual_s: float) -> None:
        """Record how far admission's TTFT prediction was from the actual TTFT."""
        if actual_s <= 0:
            return
        error = (predicted_s - actual_s) / actual_s
        self.ttft_error.labels(model).observe(error)
        self.ttft_abs_error.labels(model).observe(abs(error))


class PoolReplicaCollector(Collector):
    """Per pool: replicas by state, and over its ready replicas the mean KV cache use and the
    running and waiting sequences (the signals KEDA's Prometheus trigger scales on)."""

    def __init__(self, replicas: PoolReplicas) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = GaugeMetricFamily(
            "llmq_pool_replicas", "Replicas of the pool by state.", labels=["pool", "state"]
        )
        kv = GaugeMetricFamily(
            "llmq_pool_kv_cache_usage",
            "Mean KV cache use (0-1) of the pool's ready replicas.",
            labels=["pool"],
        )
        running = GaugeMetricFamily(
            "llmq_pool_running_sequences", "Sequences running on ready replicas.", labels=["pool"]
        )
        waiting = GaugeMetricFamily(
            "llmq_pool_waiting_sequences", "Sequences waiting in ready replicas.", labels=["pool"]
        )
        for pool, replicas in sorted(self._replicas().items()):
            states: dict[str, int] = {}
            for replica in replicas:
                label = replica.state if replica.healthy else "unhealthy"
                states[label] = states.get(label, 0) + 1
            for state, n in sorted(states.items()):
                count.add_metric([pool, state], n)
            ready = [r for r in replicas if r.state == "ready" and r.healthy]
            if ready:
                kv.add_metric([pool], sum(r.kv_cache_usage for r in ready) / len(ready))
            running.add_metric([pool], sum(r.running for r in ready))
            waiting.add_metric([pool], sum(r.waiting for r in ready))
        yield from (count, kv, running, waiting)


class ModelSloCollector(Collector):
    """Per served model (its stable version): the TTFT SLO admission holds it to and the
    TPOT its workers keep under (when set)."""

    def __init__(self, models: ServedModels) -> None:
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ttft = GaugeMetricFamily(
            "llmq_model_ttft_slo_seconds", "A model's TTFT SLO.", labels=["model", "pool"]
        )
        tpot = GaugeMetricFamily(
            "llmq_model_tpot_slo_seconds", "A model's TPOT SLO (when it has one).",
            labels=["model", "pool"],
        )  # fmt: skip
        for deployment in self._models():
            labels = [deployment.name, deployment.pool]
            ttft.add_metric(labels, deployment.ttft_slo_s)
            if deployment.tpot_slo_s is not None:
                tpot.add_metric(labels, deployment.tpot_slo_s)
        yield from (ttft, tpot)


class RelayState(Protocol):
    """What the token relay says of its subscription (`RedisReplyRelay`)."""

    connected: bool
    disconnects: int


class RelayCollector(Collector):
    def __init__(self, relay: RelayState) -> None:
        self._relay = relay

    def collect(self) -> Iterator[Metric]:
        connected = GaugeMetricFamily(
            "llmq_relay_connected", "1 while the token relay's subscription is live."
        )
        connected.add_metric([], 1.0 if self._relay.connected else 0.0)
        lost = CounterMetricFamily(
            "llmq_relay_disconnects",
            "Times the token relay lost its subscription (Redis away) and resubscribed.",
        )
        lost.add_metric([], self._relay.disconnects)
        yield from (connected, lost)


class TopicCollector(Collector):
    """The job topics' lag by pool and class and the dead letters held, as the topic watcher
    last saw them (every gateway reports the same: take the max over gateways)."""

    def __init__(self, topics: Topics) -> None:
        self._topics = topics

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "llmq_job_topic_lag",
            "Job records the pool's workers have not committed (waiting or running).",
            labels=["pool", "tier"],
        )
        dead = GaugeMetricFamily("llmq_dead_letters", "Records on the dead-letter topic.")
        snapshot = self._topics()
        if snapshot is not None:
            for (pool, tier), records in sorted(snapshot.lag.items()):
                lag.add_metric([pool, tier], records)
            dead.add_metric([], snapshot.dead_letters)
        yield from (lag, dead)
