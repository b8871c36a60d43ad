"""`llmq replay`'s rules with in-memory fakes: filters, skips, dead letters, markers, usage errors.

The reader, job queue and done ledger are fakes of the protocols `llmq.replay` depends on, so
every rule is checked without a broker; `tests/integration/test_replay.py` runs the real ones.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs
from typer.testing import CliRunner

from llmq.cli import app
from llmq.replay import (
    JobFilters,
    Replayer,
    ReplayOptions,
    ReplaySummary,
    ReplayUsageError,
    SourceRecord,
    decode,
)
from llmq.replay_input import is_job_topic, parse_time
from schemas.messages import BatchLineRef, DeadLetter, InferenceJob, SamplingSettings
from topics import catalog
from topics.ports import JobReceipt

NOW = 1_800_000_000.0
TOPIC = catalog.job_topic("p", "interactive")


def job(request_id: str, **fields: Any) -> InferenceJob:
    values: dict[str, Any] = dict(
        request_id=request_id, team="t", model="m", pool="p", prompt_token_ids=(1, 2, 3),
        sampling=SamplingSettings(max_tokens=3), created_at=NOW - 10, deadline=NOW + 60,
        reply_to="llmq:reply:g",
    )  # fmt: skip
    values.update(fields)
    return InferenceJob(**values)


def record(value: InferenceJob | bytes, offset: int, partition: int = 0) -> SourceRecord:
    raw = value.to_bytes() if isinstance(value, InferenceJob) else value
    return (TOPIC, partition, offset, int(NOW * 1000), raw)


def letter(payload: bytes, *, reason: str = "engine_failed", partition: int = 1) -> bytes:
    return DeadLetter(
        reason=reason,
        detail="RuntimeError", request_id=None, topic=TOPIC, partition=partition, offset=7,
        payload_b64=base64.b64encode(payload).decode(), failed_at=NOW - 5,
    ).to_bytes()  # fmt: skip


class FakeReader:
    """Serves fixed records; remembers how it was opened."""

    def __init__(self, records: list[SourceRecord], topics: Mapping[str, list[int]]) -> None:
        self._records = records
        self._topics = dict(topics)
        self.opened: dict[str, Any] = {}

    async def partitions(self, topic: str) -> list[int] | None:
        return self._topics.get(topic)

    async def open(
        self,
        topic: str,
        partitions: Sequence[int] | None = None,
        *,
        from_offset: int | None = None,
        to_offset: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Mapping[int, tuple[int, int]]:
        self.opened = dict(topic=topic, partitions=partitions, from_offset=from_offset,
                           to_offset=to_offset, since=since, until=until)  # fmt: skip
        return {p: (0, sum(1 for r in self._records if r[1] == p)) for p in self._topics[topic]}

    async def records(
        self, on_read: Callable[[int], None] | None = None
    ) -> AsyncIterator[SourceRecord]:
        for r in self._records:
            if on_read is not None:
                on_read(1)
            yield r


class FakeQueue:
    def __init__(self) -> None:
        self.sent: list[tuple[InferenceJob, int | None]] = []

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        self.sent.append((job, partition))
        topic = catalog.job_topic(job.pool, job.tier)
        return JobReceipt(topic=topic, partition=partition or 0, offset=len(self.sent))

    async def partitions(self, pool: str, tier: catalog.PriorityClass) -> int:
        return 2


class FakeLedger:
    def __init__(self, finished: set[str] | None = None) -> None:
        self.finished = finished or set()

    async def is_finished(self, request_id: str) -> bool:
        return request_id in self.finished


async def run(
    records: list[SourceRecord],
    *,
    finished: set[str] | None = None,
    topics: Mapping[str, list[int]] | None = None,
    **options: Any,
) -> tuple[ReplaySummary, FakeQueue]:
    opts = ReplayOptions(**({"topic": TOPIC} | options))
    queue = FakeQueue()
    reader = FakeReader(records, topics or {TOPIC: [0, 1], catalog.DEAD_TOPIC: [0]})
    replayer = Replayer(
        opts, reader, queue, FakeLedger(finished), clock=lambda: NOW, replay_id="replay_t"
    )
    summary = await replayer.run()
    assert summary.scanned == summary.selected + sum(summary.skipped.values())
    return summary, queue


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every event logged meanwhile, at any level (the process's structlog setup is restored)."""
    saved = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    try:
        with capture_logs() as captured:
            yield captured
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (JobFilters(), {"a", "b", "c", "d"}),
        (JobFilters(team="t2"), {"b", "c"}),
        (JobFilters(model="m2"), {"c"}),
        (JobFilters(team="t2", model="m2"), {"c"}),
        (JobFilters(team="t", model="m2"), set()),
        (JobFilters(batch_id="batch_1"), {"d"}),
        (JobFilters(request_ids=frozenset({"a", "c", "zz"})), {"a", "c"}),
    ],
)
async def test_filters_are_anded(filters: JobFilters, expected: set[str]) -> None:
    jobs = [
        job("a"),
        job("b", team="t2"),
        job("c", team="t2", model="m2"),
        job("d", batch=BatchLineRef(batch_id="batch_1", line=0, custom_id="x")),
    ]
    summary, queue = await run([record(j, i) for i, j in enumerate(jobs)], filters=filters)
    assert {j.request_id for j, _ in queue.sent} == expected
    assert summary.skipped["filtered"] == 4 - len(expected)
    assert summary.selected == summary.sent == len(expected)


async def test_a_replayed_job_keeps_its_id_and_carries_the_marker() -> None:
    original = job("a", reserved_tokens=9)
    summary, queue = await run([record(original, 41, partition=1)])
    (sent, partition), *_ = queue.sent
    assert partition == 1 and sent.request_id == "a"
    assert sent.replay is not None
    assert (sent.replay.replay_id, sent.replay.source_topic) == ("replay_t", TOPIC)
    assert (sent.replay.source_partition, sent.replay.source_offset) == (1, 41)
    assert sent.replay.replayed_at == NOW and sent.replay.force is False
    assert sent.model_copy(update={"replay": None}) == original
    assert summary.lines()[:3] == ["scanned: 1", "selected: 1", "sent: 1"]


async def test_logs_name_ids_and_counts_never_prompts(
    logs: list[MutableMapping[str, Any]],
) -> None:
    records = [record(job("a"), 0), record(job("b"), 1), record(b"junk", 2)]
    await run(records, finished={"b"})
    events = {e["event"]: e for e in logs}
    assert events["replay_job_sent"]["request_id"] == "a"
    assert events["replay_finished"]["sent"] == 1 and events["replay_finished"]["finished"] == 1
    assert not any(
        "prompt" in str(key) or "(1, 2, 3)" in str(v) for e in logs for key, v in e.items()
    )


async def test_finished_jobs_are_skipped_unless_forced() -> None:
    records = [record(job("a"), 0), record(job("b"), 1)]
    summary, queue = await run(records, finished={"a"})
    assert [j.request_id for j, _ in queue.sent] == ["b"] and summary.skipped["finished"] == 1
    summary, queue = await run(records, finished={"a"}, force=True)
    assert [j.request_id for j, _ in queue.sent] == ["a", "b"]
    assert summary.skipped["finished"] == 0
    assert all(j.replay is not None and j.replay.force for j, _ in queue.sent)


async def test_expired_jobs_are_skipped_even_when_forced() -> None:
    records = [record(job("old", deadline=NOW - 1), 0), record(job("ok"), 1)]
    summary, queue = await run(records, force=True)
    assert [j.request_id for j, _ in queue.sent] == ["ok"] and summary.skipped["expired"] == 1


async def test_extend_deadline_revives_expired_jobs_and_never_shortens_one() -> None:
    late = job("late", deadline=NOW + 3600)
    records = [record(job("old", deadline=NOW - 1), 0), record(late, 1)]
    summary, queue = await run(records, extend_deadline_s=120.0)
    deadlines = {j.request_id: j.deadline for j, _ in queue.sent}
    assert deadlines == {"old": NOW + 120.0, "late": NOW + 3600}
    assert summary.skipped["expired"] == 0


async def test_a_request_id_seen_twice_in_the_range_is_sent_once() -> None:
    records = [record(job("a"), 0), record(job("b"), 1), record(job("a"), 2)]
    summary, queue = await run(records)
    assert [j.request_id for j, _ in queue.sent] == ["a", "b"]
    assert queue.sent[0][0].replay is not None and queue.sent[0][0].replay.source_offset == 0
    assert summary.skipped["duplicate_in_range"] == 1


async def test_unreadable_records_are_counted_and_skipped() -> None:
    records = [record(b"\xff\xfe", 0), record(b'{"type": "inference"}', 1), record(job("a"), 2)]
    summary, queue = await run(records)
    assert summary.skipped["unreadable"] == 2 and len(queue.sent) == 1


async def test_a_job_of_another_pool_on_this_topic_is_not_sent_elsewhere() -> None:
    summary, queue = await run([record(job("a", pool="other"), 0)])
    assert queue.sent == [] and summary.skipped["misrouted"] == 1


async def test_dry_run_counts_and_sends_nothing() -> None:
    records = [record(job("a"), 0), record(job("b"), 1), record(job("c"), 2)]
    summary, queue = await run(records, finished={"c"}, dry_run=True)
    assert queue.sent == []
    assert summary.lines() == [
        "scanned: 3", "selected: 2", "sent: 0", "would_send: 2", "finished: 1", "expired: 0",
        "duplicate_in_range: 0", "filtered: 0", "unreadable: 0", "misrouted: 0",
    ]  # fmt: skip


async def test_dead_letters_go_back_to_their_original_topic_and_partition() -> None:
    dead = [
        (catalog.DEAD_TOPIC, 0, 3, 0, letter(job("a").to_bytes(), partition=1)),
        (catalog.DEAD_TOPIC, 0, 4, 0, letter(b"\xff not a job", reason="unparseable")),
        (catalog.DEAD_TOPIC, 0, 5, 0, b"not a letter"),
        (catalog.DEAD_TOPIC, 0, 6, 0, letter(job("b").to_bytes(), partition=5)),
    ]
    summary, queue = await run(dead, topic=None, dead=True)
    (sent, partition), *rest = queue.sent
    assert rest == [] and (sent.request_id, partition) == ("a", 1)
    assert sent.replay is not None
    assert (sent.replay.source_topic, sent.replay.source_offset) == (catalog.DEAD_TOPIC, 3)
    assert summary.skipped["unreadable"] == 2
    assert summary.skipped["misrouted"] == 1  # partition 5 does not exist


async def test_the_reason_filter_reads_the_letter() -> None:
    dead = [
        (catalog.DEAD_TOPIC, 0, 0, 0, letter(job("a").to_bytes(), reason="engine_failed")),
        (catalog.DEAD_TOPIC, 0, 1, 0, letter(job("b").to_bytes(), reason="unparseable")),
    ]
    summary, queue = await run(
        dead, topic=None, dead=True, filters=JobFilters(reason="unparseable")
    )
    assert [j.request_id for j, _ in queue.sent] == ["b"] and summary.skipped["filtered"] == 1


def test_decode_rejects_a_payload_that_is_not_base64() -> None:
    raw = letter(job("a").to_bytes()).replace(b'"payload_b64":"', b'"payload_b64":"!!')
    dead_record = (catalog.DEAD_TOPIC, 0, 0, 0, raw)
    assert decode(dead_record, dead=True, filters=JobFilters()) == "unreadable"


async def test_the_reader_is_opened_with_the_range_asked_for() -> None:
    reader = FakeReader([], {TOPIC: [0, 1]})
    opts = ReplayOptions(topic=TOPIC, partitions=(1,), from_offset=3, to_offset=9)
    await Replayer(opts, reader, FakeQueue(), FakeLedger()).run()
    assert reader.opened == dict(topic=TOPIC, partitions=(1,), from_offset=3, to_offset=9,
                                 since=None, until=None)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "llmq.jobs.nope.interactive"}, "unknown topic"),
        ({"partitions": (7,)}, "no partition [7]"),
    ],
)
async def test_unknown_topics_and_partitions_are_usage_errors(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ReplayUsageError, match=message.replace("[", r"\[")):
        await run([], **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one source"),
        ({"topic": TOPIC, "dead": True}, "exactly one source"),
        ({"topic": "llmq.usage"}, "not a job topic"),
        ({"topic": catalog.DEAD_TOPIC}, "--dead"),
        ({"topic": TOPIC, "from_offset": 5, "to_offset": 5}, "below --to-offset"),
        ({"topic": TOPIC, "from_offset": 1, "since": NOW}, "not both"),
        ({"topic": TOPIC, "since": NOW, "until": NOW}, "before --until"),
        ({"topic": TOPIC, "filters": JobFilters(reason="engine_failed")}, "--dead only"),
        ({"dead": True, "filters": JobFilters(reason="bored")}, "one of"),
        ({"topic": TOPIC, "extend_deadline_s": 0.0}, "> 0"),
    ],
)
def test_contradictory_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ReplayUsageError, match=message):
        ReplayOptions(**options).validate()


def test_job_topic_names() -> None:
    assert is_job_topic("llmq.jobs.p.interactive") and is_job_topic("llmq.jobs.a.b.batch")
    assert not is_job_topic("llmq.jobs..batch") and not is_job_topic("llmq.jobs.p.bulk")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1800000000", 1_800_000_000.0),
        ("1800000000.25", 1_800_000_000.25),
        ("2027-01-15T08:00:00Z", 1_800_000_000.0),
        ("2027-01-15T08:00:00", 1_800_000_000.0),
        ("2027-01-15T09:00:00+01:00", 1_800_000_000.0),
    ],
)
def test_times_are_epoch_seconds_or_iso_8601(text: str, expected: float) -> None:
    assert parse_time(text) == expected


def test_a_bad_time_is_a_usage_error() -> None:
    with pytest.raises(ReplayUsageError):
        parse_time("yesterday")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one source"),
        (["--topic", TOPIC, "--dead"], "exactly one source"),
        (["--topic", TOPIC, "--from-offset", "9", "--to-offset", "3"], "below --to-offset"),
        (["--topic", TOPIC, "--since", "yesterday"], "ISO-8601"),
        (["--topic", TOPIC, "--reason", "unparseable"], "--dead only"),
    ],
)
def test_the_command_exits_2_with_a_message_on_bad_usage(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("llmq.logging.configure_logging", lambda *a, **k: None)  # process-wide
    result = CliRunner().invoke(app, ["replay", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stdout == ""
