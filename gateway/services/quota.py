"""Team token quotas: a token bucket per team, reserved at admission, reconciled from usage.

A request reserves prompt + ``max_tokens`` before it is queued; when its usage record arrives,
the tokens it did not use (reserved - prompt - completion) go back to the bucket.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from gateway.errors import ApiError
from schemas.messages import InferenceJob, UsageRecord
from schemas.teams import TeamPolicy
from topics.ports import BucketDecision, TokenBucket

__all__ = ["QuotaService", "TeamPolicy", "quota_refusal"]

log = structlog.get_logger()


class QuotaService:
    """Reserve a request's worst case at admission; refund what it did not use."""

    def __init__(
        self,
        bucket: TokenBucket,
        policies: Mapping[str, TeamPolicy] | None = None,
        *,
        fail_open: bool = True,
    ) -> None:
        self._bucket = bucket
        self._policies = dict(policies or {})
        self._default_policy = TeamPolicy()
        self._fail_open = fail_open

    def policy_for(self, team_name: str) -> TeamPolicy:
        return self._policies.get(team_name, self._default_policy)

    async def reserve_for(
        self, team_name: str, tokens_per_minute: int, prompt_tokens: int, max_tokens: int
    ) -> BucketDecision:
        """Reserve prompt + max_tokens. Never raises: a refusal is a decision to report."""
        wanted = prompt_tokens + max_tokens
        try:
            return await self._bucket.reserve(team_name, wanted, tokens_per_minute)
        except Exception as exc:
            if not self._fail_open:
                raise
            log.warning("quota_unchecked", team=team_name, error=type(exc).__name__)
            return BucketDecision(allowed=True, remaining=0, retry_after_s=0, outcome="unchecked")

    async def release(self, team_name: str, tokens_per_minute: int, reserved_tokens: int) -> None:
        """Give a whole reservation back (the job was never queued)."""
        await self._refund(team_name, tokens_per_minute, reserved_tokens)

    async def reconcile(
        self,
        usage: UsageRecord,
        reserved_tokens: int | None = None,
        tokens_per_minute: int | None = None,
    ) -> int:
        """Refund the unused part of a reservation; returns the tokens refunded.

        `reserved_tokens` defaults to the record's own; `tokens_per_minute` to the team's policy.
        """
        reserved = usage.reserved_tokens if reserved_tokens is None else reserved_tokens
        used = usage.prompt_tokens + usage.completion_tokens
        unused = reserved - used
        if unused < 0:
            log.warning("quota_overrun", team=usage.team, request_id=usage.request_id, over=-unused)
        if unused <= 0:
            return 0
        if tokens_per_minute is None:
            tokens_per_minute = self.policy_for(usage.team).tokens_per_minute
        await self._refund(usage.team, tokens_per_minute, unused)
        return unused

    async def _refund(self, team_name: str, tokens_per_minute: int, tokens: int) -> None:
        if tokens <= 0:
            return
        try:
            await self._bucket.refund(team_name, tokens, tokens_per_minute)
        except Exception as exc:  # a lost refund only makes the quota stricter for a minute
            if not self._fail_open:
                raise
            log.warning("quota_refund_failed", team=team_name, error=type(exc).__name__)


def quota_refusal(
    team: str, tokens_per_minute: int, job: InferenceJob, decision: BucketDecision
) -> ApiError:
    """The 429 of a job its team's quota refused: for now (with a Retry-After), or for good
    when the job alone needs more than the quota holds."""
    if not decision.satisfiable:
        return ApiError(
            429,
            f"This request needs {job.reserved_tokens} tokens, more than your team's quota "
            f"of {tokens_per_minute} tokens per minute; lower max_tokens.",
            type_="rate_limit_error",
            code="rate_limit_exceeded",
        )
    return ApiError(
        429,
        f"Rate limit reached for team {team}: {tokens_per_minute} tokens per minute. "
        f"Retry after {decision.retry_after_s}s.",
        type_="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(max(decision.retry_after_s, 1))},
    )
