"""A job leaving the queue in one Redis round trip (`RedisJobStart`) reads and writes what
the separate adapters' calls (`GatheredJobStart`) do, on real Valkey."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from schemas.messages import CancelEvent, InferenceJob, SamplingSettings, UsageCounts
from topics.catalog import attempt_key
from topics.ports import AttemptRecord, StartChecks
from topics.redis_attempts import RedisJobAttempts
from topics.redis_backlog import RedisBacklog
from topics.redis_job_start import RedisJobStart
from topics.redis_relay import RedisCancelBus, RedisJobLedger
from workers.job_start import GatheredJobStart

pytestmark = pytest.mark.integration


def _job(pool: str, request_id: str) -> InferenceJob:
    return InferenceJob(
        request_id=request_id, team="t", model="m", pool=pool, prompt_token_ids=(1, 2, 3),
        sampling=SamplingSettings(max_tokens=3), created_at=0.0, deadline=4e9, reply_to="r",
    )  # fmt: skip


@pytest.mark.parametrize("one_round_trip", [True, False])
async def test_the_checks_count_the_run_and_read_finished_and_cancelled(
    redis: Redis, one_round_trip: bool
) -> None:
    backlog, attempts = RedisBacklog(redis), RedisJobAttempts(redis)
    ledger, cancels = RedisJobLedger(redis), RedisCancelBus(redis)
    start = (
        RedisJobStart(redis, backlog, attempts)
        if one_round_trip
        else GatheredJobStart(backlog, ledger, attempts, cancels)
    )
    pool = f"p{uuid.uuid4().hex[:8]}"
    fresh, done, dropped = (_job(pool, f"{name}-{uuid.uuid4().hex}") for name in "fdc")
    await backlog.add(pool, "interactive", 9, "t", 9)  # three queued 3-token prompts
    await ledger.mark_finished(done.request_id)
    await cancels.cancel(CancelEvent(request_id=dropped.request_id))

    first_run = AttemptRecord(attempt=1, failed=0, delivered=UsageCounts())
    checks = [await start.begin(job, attempt_key(job.request_id)) for job in (fresh, done, dropped)]
    assert checks == [
        StartChecks(finished=False, cancelled=False, earlier=first_run),
        StartChecks(finished=True, cancelled=False, earlier=first_run),
        StartChecks(finished=False, cancelled=True, earlier=first_run),
    ]
    assert await backlog.queued(pool, "interactive") == 0
    assert await backlog.team_queued(pool, "interactive") == {}

    # The fresh job's first run died without ending: a second run sees it as failed.
    again = await start.begin(fresh, attempt_key(fresh.request_id))
    assert again.earlier == AttemptRecord(attempt=2, failed=1, delivered=UsageCounts())
    assert await backlog.queued(pool, "interactive") == 0  # clamped at 0, never negative
