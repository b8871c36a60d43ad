"""A producer other than the gateway counts its jobs into the admission backlog, and uncounts
a job the broker did not take."""

from __future__ import annotations

import asyncio

import pytest

from schemas.messages import InferenceJob, SamplingSettings
from topics.counted_queue import AnnouncedJobQueue, CountedJobQueue
from topics.ports import JobReceipt


class Backlog:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int, str | None]] = []

    async def add(
        self,
        pool: str,
        tier: str,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        self.calls.append(("add", pool, tier, prompt_tokens, team))

    async def remove(
        self,
        pool: str,
        tier: str,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        self.calls.append(("remove", pool, tier, prompt_tokens, team))


class Queue:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.acked = 0

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        await asyncio.sleep(0)  # the broker's round trip: an announcement beside it goes first
        if self.fail:
            raise ConnectionError("broker down")
        self.acked += 1
        return JobReceipt(topic="t", partition=partition or 0, offset=7)

    async def partitions(self, pool: str, tier: str) -> int:
        return 4


JOB = InferenceJob(
    request_id="r", team="a", model="m", pool="p", prompt_token_ids=(1, 2, 3, 4),
    sampling=SamplingSettings(max_tokens=3), created_at=0.0, deadline=1.0, reply_to="x",
)  # fmt: skip


async def test_a_job_is_counted_before_it_is_produced() -> None:
    backlog = Backlog()
    queue = CountedJobQueue(Queue(), backlog)  # type: ignore[arg-type]
    receipt = await queue.submit(JOB, partition=2)
    assert receipt.partition == 2 and await queue.partitions("p", "interactive") == 4
    assert backlog.calls == [("add", "p", "interactive", 4, "a")]


async def test_a_job_the_broker_did_not_take_is_uncounted() -> None:
    backlog = Backlog()
    queue = CountedJobQueue(Queue(fail=True), backlog)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        await queue.submit(JOB)
    assert [call[0] for call in backlog.calls] == ["add", "remove"]


class Wake:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.announced: list[tuple[str, int]] = []

    async def announce(self, pool: str) -> None:
        self.announced.append((pool, self.queue.acked))


async def test_a_job_is_announced_once_the_broker_has_it() -> None:
    # A worker woken by the announcement fetches at once: the job must be there already.
    queue = Queue()
    wake = Wake(queue)
    await AnnouncedJobQueue(queue, wake).submit(JOB)  # type: ignore[arg-type]
    assert wake.announced == [("p", 1)]
    with pytest.raises(ConnectionError):
        await AnnouncedJobQueue(Queue(fail=True), wake).submit(JOB)  # type: ignore[arg-type]
    assert len(wake.announced) == 1  # nothing queued: nothing announced
