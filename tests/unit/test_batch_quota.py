"""Batch lines reserve their team's quota, waiting (never failing) while the bucket is short."""

from __future__ import annotations

import pytest

from batch.quota import LineQuota
from batch.validation import LineError
from schemas.teams import TeamPolicy
from topics.ports import BucketDecision


class ScriptedBucket:
    """Answers reservations from a script of decisions (or exceptions to raise)."""

    def __init__(self, *answers: BucketDecision | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int, int]] = []

    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        self.asked.append((team, tokens, tokens_per_minute))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        raise AssertionError("the fan-out never refunds")


OK = BucketDecision(allowed=True, remaining=10, retry_after_s=0)
SHORT = BucketDecision(allowed=False, remaining=5, retry_after_s=3, outcome="insufficient_tokens")
TOO_BIG = BucketDecision(allowed=False, remaining=5, retry_after_s=0, outcome="exceeds_capacity")
UNCHECKED = BucketDecision(allowed=True, remaining=0, retry_after_s=0, outcome="unchecked")


async def test_a_line_waits_for_the_bucket_to_refill_then_is_reserved() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    bucket = ScriptedBucket(SHORT, SHORT, OK)
    quota = LineQuota(bucket, {"a": TeamPolicy(tokens_per_minute=600)}, sleep=sleep)
    assert await quota.reserve("a", 40) == 40
    assert slept == [3, 3] and bucket.asked == [("a", 40, 600)] * 3


@pytest.mark.parametrize(
    ("answer", "reserved"),
    [(UNCHECKED, 0), (ConnectionError("redis down"), 0), (OK, 40)],
)
async def test_an_unreachable_bucket_lets_the_line_through_unreserved(
    answer: BucketDecision | Exception, reserved: int
) -> None:
    assert await LineQuota(ScriptedBucket(answer)).reserve("b", 40) == reserved


async def test_a_line_larger_than_a_minutes_quota_fails_alone() -> None:
    quota = LineQuota(ScriptedBucket(TOO_BIG), {"a": TeamPolicy(tokens_per_minute=30)})
    with pytest.raises(LineError) as failed:
        await quota.reserve("a", 40)
    assert failed.value.code == "rate_limit_exceeded" and "30 tokens per minute" in str(
        failed.value
    )


def test_a_team_not_named_gets_the_default_policy() -> None:
    quota = LineQuota(ScriptedBucket(), {"a": TeamPolicy(weight=3.0)})
    assert quota.policy("a").weight == 3.0 and quota.policy("z") == TeamPolicy()
