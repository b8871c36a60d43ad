"""`/metrics` of the processes without an API: the probe server serves them, a worker reports
its engine load and the work it did, a batch service its lines (each counted once)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from batch.metrics import ActiveBatches, BatchServiceCollector, batch_exposition
from llmq.probes import ProbeServer
from schemas.batches import Batch, BatchRequestCounts
from schemas.messages import DeadLetter, InferenceJob, SamplingSettings
from topics.redis_relay import RedisReplicaDirectory
from workers.heartbeat import Heartbeat
from workers.load import LoadTracker
from workers.metrics import CountedDeadLetterSink, WorkerMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def test_the_probe_server_serves_metrics_beside_its_probes() -> None:
    async def yes() -> bool:
        return True

    with_metrics = ProbeServer("127.0.0.1", 0, healthy=yes, ready=yes, metrics=lambda: b"m 1\n")
    without = ProbeServer("127.0.0.1", 0, healthy=yes, ready=yes)
    for server in (with_metrics, without):
        await server.start()
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            served = await http.get(f"http://127.0.0.1:{with_metrics.port}/metrics")
            absent = await http.get(f"http://127.0.0.1:{without.port}/metrics")
            ready = await http.get(f"http://127.0.0.1:{with_metrics.port}/readyz")
    finally:
        for server in (with_metrics, without):
            await server.stop()
    assert served.status_code == 200 and served.text == "m 1\n"
    assert served.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert absent.status_code == 404
    assert ready.json() == {"status": "ok"}


def job(request_id: str, prompt: int, waited_s: float, tier: str = "interactive") -> InferenceJob:
    return InferenceJob(
        request_id=request_id, team="t", model="m", pool="p", tier=tier,  # type: ignore[arg-type]
        prompt_token_ids=tuple(range(prompt)), sampling=SamplingSettings(max_tokens=8),
        created_at=time.time() - waited_s, deadline=time.time() + 60, reply_to="r",
    )  # fmt: skip


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[DeadLetter] = []

    async def publish(self, letter: DeadLetter) -> None:
        if self.fail:
            raise ConnectionError("broker away")
        self.sent.append(letter)


def letter(reason: str) -> DeadLetter:
    return DeadLetter(reason=reason, detail="d", topic="t", partition=0, offset=1,  # type: ignore[arg-type]
                      payload_b64="", failed_at=0.0)  # fmt: skip


async def test_a_worker_reports_its_state_load_and_work_done() -> None:
    heartbeat = Heartbeat(RedisReplicaDirectory(Redis()), replica_id="w-0", pool="p", model="m",
                          interval_s=1.0)  # fmt: skip
    metrics = WorkerMetrics(heartbeat)
    loading = samples(metrics.exposition().decode())
    replica = {"pool": "p", "model": "m", "replica": "w-0"}
    assert value(loading, "llmq_worker_state", **replica, state="loading") == 1
    assert value(loading, "llmq_worker_state", **replica, state="ready") == 0
    assert ("llmq_worker_jobs_started_total", ()) not in loading  # no load tracker yet

    load = LoadTracker(on_started=metrics.job_started)
    heartbeat.load = load
    heartbeat.state = "ready"
    load.started(job("a", prompt=100, waited_s=0.2))
    load.started(job("b", prompt=50, waited_s=30.0, tier="batch"))
    load.produced("a", 1, cached_tokens=64)  # first token: 36 prefilled, 64 from the cache
    load.produced("a", 2, cached_tokens=64)
    load.produced("b", 1, cached_tokens=0)
    load.finished("a")
    sink = CountedDeadLetterSink(Sink(), metrics)
    await sink.publish(letter("unparseable"))
    await sink.publish(letter("unparseable"))
    await sink.publish(letter("engine_failed"))
    broken = CountedDeadLetterSink(Sink(fail=True), metrics)
    try:
        await broken.publish(letter("engine_failed"))
    except ConnectionError:
        pass  # not on the broker: not counted

    found = samples(metrics.exposition().decode())
    assert value(found, "llmq_worker_state", **replica, state="ready") == 1
    assert value(found, "llmq_worker_healthy", **replica) == 1
    assert value(found, "llmq_worker_jobs_started_total", **replica) == 2
    assert value(found, "llmq_worker_prompt_tokens_total", **replica, cache="hit") == 64
    assert value(found, "llmq_worker_prompt_tokens_total", **replica, cache="miss") == 36 + 50
    assert value(found, "llmq_worker_generated_tokens_total", **replica) == 4
    assert value(found, "llmq_worker_jobs_in_flight", **replica) == 1
    interactive = {**replica, "tier": "interactive"}
    assert value(found, "llmq_worker_queue_time_seconds_count", **interactive) == 1
    assert 0.2 <= value(found, "llmq_worker_queue_time_seconds_sum", **interactive) < 5
    assert value(found, "llmq_worker_queue_time_seconds_bucket", **interactive, le="0.1") == 0
    batch_queue = {**replica, "tier": "batch"}
    assert value(found, "llmq_worker_queue_time_seconds_bucket", **batch_queue, le="10.0") == 0
    assert value(found, "llmq_worker_queue_time_seconds_bucket", **batch_queue, le="60.0") == 1
    assert value(found, "llmq_worker_dead_letters_total", **replica, reason="unparseable") == 2
    assert value(found, "llmq_worker_dead_letters_total", **replica, reason="engine_failed") == 1
    heartbeat.healthy = False
    heartbeat.state = "draining"
    late = samples(metrics.exposition().decode())
    assert value(late, "llmq_worker_healthy", **replica) == 0
    assert value(late, "llmq_worker_state", **replica, state="draining") == 1


@dataclass
class Counts:
    queued: int = 0
    duplicates: int = 0
    lines_recorded: dict[str, int] = field(default_factory=lambda: {"completed": 0, "failed": 0})


def in_progress(batch_id: str, status: str, **counts: int) -> Batch:
    return Batch(
        id=batch_id, endpoint="/v1/chat/completions", input_file_id="f", completion_window="24h",
        status=status, created_at=1, request_counts=BatchRequestCounts(**counts),  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_batch_service_reports_lines_and_open_batches() -> None:
    counts = Counts(queued=7, duplicates=2, lines_recorded={"completed": 5, "failed": 1})
    active = ActiveBatches()
    active.add(in_progress("b1", "in_progress", total=10, completed=5, failed=1))
    active.add(in_progress("b2", "in_progress", total=3))
    active.add(in_progress("b3", "cancelling", total=2, failed=2))
    page = batch_exposition(BatchServiceCollector(counts, counts, counts, lambda: active))
    found = samples(page().decode())
    assert value(found, "llmq_batch_lines_queued_total") == 7
    assert value(found, "llmq_batch_lines_finished_total", outcome="completed") == 5
    assert value(found, "llmq_batch_lines_finished_total", outcome="failed") == 1
    assert value(found, "llmq_batch_result_duplicates_total") == 2
    assert value(found, "llmq_batches", status="in_progress") == 2
    assert value(found, "llmq_batches", status="cancelling") == 1
    assert value(found, "llmq_batches", status="finalizing") == 0
    assert value(found, "llmq_batch_lines_pending") == 4 + 3
