"""Prometheus metrics of one worker, served on its probe port (`GET /metrics`).

Everything but queue time is read at scrape time from what the worker keeps anyway (its
heartbeat's view of the engine, the load tracker's running totals), so the per-token path
adds nothing but integer increments. Every series carries the replica's `pool`, `model` and
`replica` (one value each per process: bounded by the fleet), queue time also its `tier`.

- State: `llmq_worker_state{state}` (1 for the current one: loading, ready, draining),
  `llmq_worker_healthy` (0 once its engine failed its checks).
- Engine load: KV cache use, running and waiting sequences, sequence slots (the TPOT cap),
  jobs held, outstanding tokens, prefill rate, adapters loaded.
- Work done: jobs started, prompt tokens by cache hit or miss, generated tokens, dead letters
  by reason (the prefill and decode rates are `rate()` of the token counters).
- `llmq_worker_queue_time_seconds{tier}`: the gateway's acceptance of a job (its
  `created_at`, the gateway's clock) to this worker starting it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.messages import DeadLetter, InferenceJob
from topics.ports import DeadLetterSink
from workers.heartbeat import Heartbeat

REPLICA_LABELS = ["pool", "model", "replica"]
STATES = ("loading", "ready", "draining")
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class WorkerMetrics:
    """The worker's registry: its collector over the heartbeat, queue time and dead letters."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.registry = CollectorRegistry()
        current = heartbeat.current()
        self._labels = (current.pool, current.model, current.replica_id)
        self.registry.register(WorkerStateCollector(heartbeat, self._labels))
        self._queue_time = Histogram(
            "llmq_worker_queue_time_seconds",
            "From the gateway accepting a job to this worker starting it.",
            [*REPLICA_LABELS, "tier"],
            buckets=_QUEUE_BUCKETS,
            registry=self.registry,
        )
        self._dead_letters = Counter(
            "llmq_worker_dead_letters",
            "Records this worker set aside on the dead-letter topic, by reason.",
            [*REPLICA_LABELS, "reason"],
            registry=self.registry,
        )

    def job_started(self, job: InferenceJob) -> None:
        """Observe a job's queue time as it starts (`LoadTracker`'s start hook)."""
        waited = max(0.0, time.time() - job.created_at)  # clocks of two hosts: never negative
        self._queue_time.labels(*self._labels, job.tier).observe(waited)

    def dead_lettered(self, letter: DeadLetter) -> None:
        self._dead_letters.labels(*self._labels, letter.reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class CountedDeadLetterSink:
    """A `DeadLetterSink` that counts each letter once it is on the broker."""

    def __init__(self, sink: DeadLetterSink, metrics: WorkerMetrics) -> None:
        self._sink = sink
        self._metrics = metrics

    async def publish(self, letter: DeadLetter) -> None:
        await self._sink.publish(letter)
        self._metrics.dead_lettered(letter)


class WorkerStateCollector(Collector):
    """Gauges and counters read from the heartbeat (and its load tracker) at every scrape."""

    def __init__(self, heartbeat: Heartbeat, labels: tuple[str, str, str]) -> None:
        self._heartbeat = heartbeat
        self._labels = list(labels)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=REPLICA_LABELS)
        family.add_metric(self._labels, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=REPLICA_LABELS)
        family.add_metric(self._labels, value)
        return family

    def collect(self) -> Iterator[Metric]:
        beat = self._heartbeat.current()
        state = GaugeMetricFamily(
            "llmq_worker_state", "1 for the replica's current state.",
            labels=[*REPLICA_LABELS, "state"],
        )  # fmt: skip
        for name in STATES:
            state.add_metric([*self._labels, name], 1.0 if beat.state == name else 0.0)
        yield state
        yield self._gauge("llmq_worker_healthy", "1 while its engine passes its health checks.",
                          1.0 if beat.healthy else 0.0)  # fmt: skip
        yield self._gauge("llmq_worker_kv_cache_usage", "KV cache in use (0-1).",
                          beat.kv_cache_usage)  # fmt: skip
        yield self._gauge("llmq_worker_running_sequences", "Sequences the engine runs.",
                          beat.running)  # fmt: skip
        yield self._gauge("llmq_worker_waiting_sequences", "Sequences waiting in the engine.",
                          beat.waiting)  # fmt: skip
        yield self._gauge("llmq_worker_sequence_slots",
                          "Sequences it may run: max_num_seqs, or fewer under the TPOT cap.",
                          beat.max_num_seqs)  # fmt: skip
        yield self._gauge("llmq_worker_jobs_in_flight", "Jobs held (started, not finished).",
                          beat.in_flight)  # fmt: skip
        yield self._gauge("llmq_worker_outstanding_tokens",
                          "Prompt tokens still to prefill plus output tokens still to decode.",
                          beat.outstanding_tokens)  # fmt: skip
        yield self._gauge("llmq_worker_prefill_tokens_per_second",
                          "Prefill rate estimate (the engine's own, else first-token timings).",
                          beat.prefill_tokens_per_s)  # fmt: skip
        yield self._gauge("llmq_worker_adapters_loaded", "LoRA adapters loaded in the engine.",
                          len(beat.adapters))  # fmt: skip
        load = self._heartbeat.load
        if load is None:
            return
        totals = load.totals
        yield self._counter("llmq_worker_jobs_started", "Jobs started on the engine.",
                            totals.jobs_started)  # fmt: skip
        prompt = CounterMetricFamily(
            "llmq_worker_prompt_tokens",
            "Prompt tokens of jobs that got their first token, from the prefix cache (hit) "
            "or prefilled (miss).",
            labels=[*REPLICA_LABELS, "cache"],
        )
        prompt.add_metric([*self._labels, "hit"], totals.cached_tokens)
        prompt.add_metric([*self._labels, "miss"], totals.prefilled_tokens)
        yield prompt
        yield self._counter("llmq_worker_generated_tokens", "Output tokens generated.",
                            totals.generated_tokens)  # fmt: skip
