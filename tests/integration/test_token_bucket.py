"""Team token buckets on real Valkey: refusal and Retry-After, refill, refund cap, atomicity."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import Redis

from gateway.services.quota import QuotaService, TeamPolicy
from schemas.messages import UsageRecord
from topics.catalog import bucket_key
from topics.ports import BucketDecision, TokenBucket
from topics.redis_token_bucket import RedisTokenBucket

pytestmark = pytest.mark.integration


class Clock:
    """A hand-driven clock in milliseconds (the script's `now` instead of Redis TIME)."""

    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


@pytest.fixture
def team() -> str:
    return f"team-{uuid.uuid4().hex[:8]}"


async def test_empty_bucket_refuses_with_a_retry_after_from_the_refill_rate(
    redis: Redis, team: str
) -> None:
    clock = Clock()
    bucket = RedisTokenBucket(redis, clock_ms=clock)
    full = await bucket.reserve(team, 600, tokens_per_minute=600)  # 10 tokens/s
    assert (full.allowed, full.remaining) == (True, 0)

    refused = await bucket.reserve(team, 25, tokens_per_minute=600)
    assert (refused.allowed, refused.retry_after_s, refused.outcome) == (
        False,
        3,
        "insufficient_tokens",
    )
    assert refused.satisfiable

    clock.advance(2.0)  # 20 tokens back: 5 short, half a second
    almost = await bucket.reserve(team, 25, tokens_per_minute=600)
    assert (almost.allowed, almost.remaining, almost.retry_after_s) == (False, 20, 1)

    clock.advance(0.5)
    assert (await bucket.reserve(team, 25, tokens_per_minute=600)).allowed
    assert await bucket.tokens(team, 600) == pytest.approx(0.0)


async def test_refill_is_continuous_and_capped_at_one_minute(redis: Redis, team: str) -> None:
    clock = Clock()
    bucket = RedisTokenBucket(redis, clock_ms=clock)
    await bucket.reserve(team, 600, tokens_per_minute=600)
    clock.advance(0.25)
    assert await bucket.tokens(team, 600) == pytest.approx(2.5)
    clock.advance(10.0)
    assert await bucket.tokens(team, 600) == pytest.approx(102.5)
    clock.advance(600.0)
    assert await bucket.tokens(team, 600) == pytest.approx(600.0)


async def test_refund_is_capped_at_capacity(redis: Redis, team: str) -> None:
    clock = Clock()
    bucket = RedisTokenBucket(redis, clock_ms=clock)
    assert (await bucket.reserve(team, 100, tokens_per_minute=600)).remaining == 500
    await bucket.refund(team, 40, tokens_per_minute=600)
    assert await bucket.tokens(team, 600) == pytest.approx(540.0)
    await bucket.refund(team, 300, tokens_per_minute=600)
    assert await bucket.tokens(team, 600) == pytest.approx(600.0)


async def test_a_reservation_above_capacity_is_never_satisfiable(redis: Redis, team: str) -> None:
    bucket = RedisTokenBucket(redis, clock_ms=Clock())
    decision = await bucket.reserve(team, 601, tokens_per_minute=600)
    assert (decision.allowed, decision.outcome, decision.retry_after_s) == (
        False,
        "exceeds_capacity",
        0,
    )
    assert not decision.satisfiable
    assert decision.remaining == 600  # nothing was taken


async def test_server_time_refills_the_bucket(redis: Redis, team: str) -> None:
    bucket = RedisTokenBucket(redis)  # the Redis server's TIME
    assert (await bucket.reserve(team, 600, tokens_per_minute=600)).allowed
    refused = await bucket.reserve(team, 5, tokens_per_minute=600)
    assert (refused.allowed, refused.retry_after_s) == (False, 1)
    await asyncio.sleep(0.6)
    assert (await bucket.reserve(team, 5, tokens_per_minute=600)).allowed
    ttl_ms = await redis.pttl(bucket_key(team))
    assert 110_000 < ttl_ms <= 120_000


@pytest.mark.parametrize("clocked", [True, False], ids=["frozen clock", "server TIME"])
async def test_concurrent_reservations_never_overspend(
    redis: Redis, team: str, clocked: bool
) -> None:
    bucket = RedisTokenBucket(redis, clock_ms=Clock() if clocked else None)
    # 3,600/min refills 60 tokens/s: the gather (milliseconds) cannot earn another 120 tokens.
    decisions = await asyncio.gather(*(bucket.reserve(team, 120, 3_600) for _ in range(50)))
    assert sum(d.allowed for d in decisions) == 30
    assert min(d.remaining for d in decisions) >= 0


async def test_quota_service_reserves_worst_case_and_refunds_unused(
    redis: Redis, team: str
) -> None:
    clock = Clock()
    bucket: TokenBucket = RedisTokenBucket(redis, clock_ms=clock)
    quota = QuotaService(bucket, {team: TeamPolicy(tokens_per_minute=600)})
    decision = await quota.reserve_for(team, 600, prompt_tokens=100, max_tokens=400)
    assert (decision.allowed, decision.remaining) == (True, 100)

    usage = UsageRecord(
        request_id="chatcmpl-1",
        team=team,
        model="m",
        tier="interactive",
        prompt_tokens=100,
        cached_tokens=0,
        completion_tokens=50,
        reserved_tokens=500,
        finish_reason="stop",
        finished_at=time.time(),
    )
    assert await quota.reconcile(usage) == 350
    assert await RedisTokenBucket(redis, clock_ms=clock).tokens(team, 600) == pytest.approx(450)
    assert await quota.reconcile(usage, reserved_tokens=120) == 0  # overrun: nothing refunded

    await quota.release(team, 600, 150)
    assert await RedisTokenBucket(redis, clock_ms=clock).tokens(team, 600) == pytest.approx(600)


class BrokenBucket:
    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        raise ConnectionError("redis away")

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        raise ConnectionError("redis away")


async def test_quota_fails_open_unless_told_not_to() -> None:
    decision = await QuotaService(BrokenBucket()).reserve_for("t", 600, 10, 10)
    assert (decision.allowed, decision.outcome) == (True, "unchecked")
    with pytest.raises(ConnectionError):
        await QuotaService(BrokenBucket(), fail_open=False).reserve_for("t", 600, 10, 10)


def test_team_policy_validates_key_digests() -> None:
    digest = "A" * 64
    assert TeamPolicy(key_sha256=[digest]).key_sha256 == ["a" * 64]
    with pytest.raises(ValueError):
        TeamPolicy(key_sha256=["sk-not-a-digest"])
    with pytest.raises(ValueError):
        TeamPolicy(tokens_per_minute=0)
