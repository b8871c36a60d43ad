"""Team quotas for batch lines: each line reserves its worst case (prompt + ``max_tokens``)
from its team's token bucket before it is queued, as a chat request does at admission.

A batch is never refused for quota: while the bucket is short, the fan-out waits for it to
refill, so a team's batch spends its quota at the team's rate and cannot bypass it. A line
that needs more than a whole minute's quota can never be reserved; it fails alone
(``rate_limit_exceeded``). The usage record of each line carries the reservation, and the
gateways' reconcilers refund what the line did not use, as for chat requests. An unreachable
bucket lets lines through unreserved (fail open, as the gateway does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import structlog

from batch.validation import LineError
from schemas.teams import TeamPolicy
from topics.ports import TokenBucket

log = structlog.get_logger()


class LineQuota:
    def __init__(
        self,
        bucket: TokenBucket,
        teams: Mapping[str, TeamPolicy] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._bucket = bucket
        self._teams = dict(teams or {})
        self._default = TeamPolicy()
        self._sleep = sleep

    def policy(self, team: str) -> TeamPolicy:
        return self._teams.get(team, self._default)

    async def reserve(self, team: str, tokens: int) -> int:
        """Reserve ``tokens`` for one line, waiting while the bucket is short; returns the
        tokens reserved (0 when the bucket was unreachable)."""
        quota = self.policy(team).tokens_per_minute
        while True:
            try:
                decision = await self._bucket.reserve(team, tokens, quota)
            except Exception as exc:
                log.warning("quota_unchecked", team=team, error=type(exc).__name__)
                return 0
            if decision.allowed:
                return 0 if decision.outcome == "unchecked" else tokens
            if not decision.satisfiable:
                raise LineError(
                    "rate_limit_exceeded",
                    f"This request needs {tokens} tokens, more than the team's quota of "
                    f"{quota} tokens per minute; lower max_tokens.",
                )
            log.info("batch_line_throttled", team=team, retry_after_s=decision.retry_after_s)
            await self._sleep(max(decision.retry_after_s, 1))
