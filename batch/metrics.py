"""Prometheus metrics of one batch service, served on its probe port (`GET /metrics`).

Read at scrape time from counters the service keeps anyway: lines it produced as jobs, line
results it recorded first (the store counts a line once, however often its result arrives),
duplicate results it dropped, and what its sweeper last saw of the batches not yet final.
Several batch services run side by side: sum the counters over them; the sweeper gauges are
the same on each (they read the shared state), so take their max.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.batches import Batch


@dataclass
class ActiveBatches:
    """Batches not yet final, by status, and their lines without a result yet."""

    by_status: dict[str, int] = field(default_factory=dict)
    pending_lines: int = 0

    def add(self, batch: Batch) -> None:
        self.by_status[batch.status] = self.by_status.get(batch.status, 0) + 1
        counts = batch.request_counts
        self.pending_lines += max(counts.total - counts.completed - counts.failed, 0)


class Producing(Protocol):
    queued: int
    """Lines produced as jobs (`BatchFanout`)."""


class Recording(Protocol):
    lines_recorded: dict[str, int]
    """Line results recorded first, by outcome (`RedisBatchStore`)."""


class Collecting(Protocol):
    duplicates: int
    """Results dropped as duplicates (`ResultCollector`)."""


class BatchServiceCollector(Collector):
    def __init__(
        self,
        store: Recording,
        fanout: Producing,
        collector: Collecting,
        active: Callable[[], ActiveBatches],
    ) -> None:
        self._store = store
        self._fanout = fanout
        self._collector = collector
        self._active = active

    def collect(self) -> Iterator[Metric]:
        queued = CounterMetricFamily(
            "llmq_batch_lines_queued", "Batch lines this service produced to the job topics."
        )
        queued.add_metric([], self._fanout.queued)
        yield queued
        finished = CounterMetricFamily(
            "llmq_batch_lines_finished",
            "Batch line results recorded (each line once), by outcome: completed, or failed "
            "(an error line: refused at fan-out, failed, cancelled or expired).",
            labels=["outcome"],
        )
        for outcome, n in sorted(self._store.lines_recorded.items()):
            finished.add_metric([outcome], n)
        yield finished
        duplicates = CounterMetricFamily(
            "llmq_batch_result_duplicates",
            "Results of lines that already had one (a redelivery), dropped.",
        )
        duplicates.add_metric([], self._collector.duplicates)
        yield duplicates
        active = self._active()
        batches = GaugeMetricFamily(
            "llmq_batches", "Batches not yet final, by status.", labels=["status"]
        )
        for status in ("validating", "in_progress", "finalizing", "cancelling"):
            batches.add_metric([status], active.by_status.get(status, 0))
        yield batches
        pending = GaugeMetricFamily(
            "llmq_batch_lines_pending", "Lines of batches not yet final that have no result yet."
        )
        pending.add_metric([], active.pending_lines)
        yield pending


def batch_exposition(collector: BatchServiceCollector) -> Callable[[], bytes]:
    """The `/metrics` body of a batch service."""
    registry = CollectorRegistry()
    registry.register(collector)
    return lambda: generate_latest(registry)
