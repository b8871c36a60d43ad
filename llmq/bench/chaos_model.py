"""What `llmq bench chaos` counts, and how (pure: no I/O, unit-tested).

Each request the bench sends ends in one client-side outcome:

- ``completed``: a whole answer (a stream's finish chunk, or a non-streaming completion);
- ``interrupted``: a stream ended by an error event ``stream_interrupted`` (its worker died
  after it had sent tokens, or the token relay was cut);
- ``refused``: a 429 or 503 answered before any stream opened (the caller was told at once and
  may retry: nothing was accepted);
- ``failed``: any other error the caller was told about (an error event or a 5xx with a body);
- ``lost``: no outcome at all: the client timed out, or the connection ended without one.

Then the broker's usage topic and the job-run counters in Redis are read back:

- ``duplicated``: requests with more than one usage record (processed twice to completion);
- ``unbilled``: accepted requests (completed, interrupted, failed) with no usage record: work
  done but never metered is lost too, so they count in ``lost``;
- ``retried``: completed requests whose job ran more than once (invisibly to the caller).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["completed", "interrupted", "refused", "failed", "lost"]
ACCEPTED: frozenset[str] = frozenset({"completed", "interrupted", "failed"})


@dataclass
class ChaosRequest:
    """One request as the client saw it."""

    index: int
    stream: bool
    tier: str
    started_s: float
    outcome: Outcome = "lost"
    request_id: str | None = None
    tokens_seen: int = 0
    detail: str = ""
    ttft_s: float | None = None
    """Sent to first content token (streams only)."""
    served_by: str | None = None
    """The answer's `system_fingerprint`: the deployment version that served it."""


@dataclass(frozen=True)
class ChaosFigures:
    sent: int
    completed: int
    retried: int
    interrupted: int
    refused: int
    failed: int
    lost: int
    duplicated: int
    unbilled: int
    failures: dict[str, int] = field(default_factory=dict)
    """Why requests ``failed`` (error code -> count)."""

    def lines(self) -> list[str]:
        """One ``name: value`` line per figure."""
        names = [
            "sent", "completed", "retried", "interrupted", "refused", "failed", "lost",
            "duplicated", "unbilled",
        ]  # fmt: skip
        out = [f"{name}: {getattr(self, name)}" for name in names]
        out += [f"failed[{code}]: {count}" for code, count in sorted(self.failures.items())]
        return out


def tally(
    requests: list[ChaosRequest], usage_counts: Counter[str], runs: dict[str, int]
) -> ChaosFigures:
    """The figures, from client outcomes, usage records per request id, and runs per id."""
    outcomes = Counter(r.outcome for r in requests)
    accepted = [r for r in requests if r.outcome in ACCEPTED and r.request_id]
    unbilled = sum(1 for r in accepted if usage_counts[r.request_id or ""] == 0)
    ours = {r.request_id for r in requests if r.request_id}
    duplicated = sum(1 for rid in ours if usage_counts[rid or ""] > 1)
    retried = sum(
        1 for r in requests if r.outcome == "completed" and runs.get(r.request_id or "", 1) > 1
    )
    failures = Counter(r.detail for r in requests if r.outcome == "failed")
    return ChaosFigures(
        sent=len(requests),
        completed=outcomes["completed"],
        retried=retried,
        interrupted=outcomes["interrupted"],
        refused=outcomes["refused"],
        failed=outcomes["failed"],
        lost=outcomes["lost"] + unbilled,
        duplicated=duplicated,
        unbilled=unbilled,
        failures=dict(failures),
    )
