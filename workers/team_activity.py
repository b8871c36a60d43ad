"""Which teams are active on a worker, their weights, and how each has behaved lately.

A team is active while it holds or buffers a job here and for a short while after, so a team
that sends steadily keeps its share of the slots between its requests instead of losing them
to a flooding team each time its last job ends.

Two moving averages tell a steady sender from a flooding team (see
`HeadroomPolicy.light_teams`):
- the slots it held;
- the share of time it had work waiting to start: jobs buffered here, or the pool's queue for
  it (admitted, not yet started anywhere; `watch_team_queues` reads it from the admission
  backlog). A flooding team always has a queue, though admission and its share of the slots
  keep it short; a steady sender has one only in its rare bursts.

A newcomer's waiting share starts at 1 (always waiting) and earns its way down, and a team no
longer active is forgotten: a flood's first jobs never pass for a light sender's, nor do those
of a flooding team that paused and came back with its old, decayed averages.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from topics.ports import QueueBacklog

log = structlog.get_logger()

TEAM_ACTIVE_S = 10.0
"""A team stays active (keeps its share of slots) this long after it last held or buffered a
job here, so a team sending steadily keeps its share between requests."""


@dataclass(frozen=True)
class TeamBehaviour:
    """What the headroom policy needs to know of the active teams."""

    weights: dict[str, float]
    """Weight of every active team."""
    usage: dict[str, float]
    """Slots each team held on average lately."""
    waiting: dict[str, float]
    """Share of time (0..1) each team had work waiting to start, lately."""


class TeamActivity:
    def __init__(
        self,
        linger_s: float,
        clock: Callable[[], float] = time.monotonic,
        usage_window_s: float = 30.0,
    ) -> None:
        self._linger_s = linger_s
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._window_s = usage_window_s
        self._usage: dict[str, float] = {}
        self._waiting: dict[str, float] = {}
        self._observed_at: float | None = None
        self._queued_tokens: dict[str, int] = {}
        self._prompt_tokens: dict[str, int] = {}

    def note_prompt(self, team: str, prompt_tokens: int) -> None:
        """Remember the size of a team's latest prompt (to count its queue in jobs)."""
        self._prompt_tokens[team] = max(prompt_tokens, 1)

    def note_queued(self, queued_tokens: Mapping[str, int]) -> None:
        """The pool's queued prompt tokens per team (admitted, not started on any worker)."""
        self._queued_tokens = dict(queued_tokens)

    def note_started(self, team: str, prompt_tokens: int) -> None:
        """A job of ``team`` started here: take it off the last read of the pool's queue at
        once (the next read would show it only up to ``interval_s`` later), so a steady
        sender's every job does not count as waiting until then."""
        left = self._queued_tokens.get(team, 0) - prompt_tokens
        if left > 0:
            self._queued_tokens[team] = left
        else:
            self._queued_tokens.pop(team, None)

    def waiting_jobs(self, buffered: Iterable[str]) -> dict[str, float]:
        """Jobs waiting to start for each team: the larger of those ``buffered`` here and the
        pool's queue for it, counted in prompts of its latest size. Teams this worker has not
        seen a job of are left out."""
        here = Counter(buffered)
        waiting: dict[str, float] = {}
        for team in {*here, *self._queued_tokens}:
            size = self._prompt_tokens.get(team)
            if size is not None:
                waiting[team] = max(float(here[team]), self._queued_tokens.get(team, 0) / size)
        return waiting

    def observe(
        self, held: Mapping[str, int], waiting: Mapping[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Update and return each team's average slots held and share of time with a job
        waiting (moving averages over ``usage_window_s``).

        A team's first waiting share is 1: until its record shows otherwise, a newcomer counts
        as a flooding team (a steady sender's share falls below one half within the window)."""
        now = self._clock()
        decay = (
            1.0
            if self._observed_at is None
            else math.exp(-(now - self._observed_at) / self._window_s)
        )
        self._observed_at = now
        usage: dict[str, float] = {}
        waits: dict[str, float] = {}
        for team in {*self._usage, *held, *waiting}:
            holds = float(held.get(team, 0))
            waits_now = 1.0 if waiting.get(team, 0.0) >= 0.5 else 0.0
            used = holds + (self._usage.get(team, holds) - holds) * decay
            waited = waits_now + (self._waiting.get(team, 1.0) - waits_now) * decay
            if used < 0.01 and waited < 0.01 and team not in held:
                self.forget(team)
                continue
            self._usage[team] = usage[team] = used
            self._waiting[team] = waits[team] = waited
        return usage, waits

    def forget(self, team: str) -> None:
        """Drop a team's averages: it comes back as a newcomer."""
        self._usage.pop(team, None)
        self._waiting.pop(team, None)

    def behaviour(self, held: Mapping[str, int], buffered: Iterable[str]) -> TeamBehaviour:
        """Observe the teams (held here, ``buffered`` here, queued in the pool) and report
        what the headroom policy weighs: active weights, usage, waiting."""
        buffered = list(buffered)
        weights = self.active(held, buffered)
        usage, waiting = self.observe(held, self.waiting_jobs(buffered))
        return TeamBehaviour(weights, usage, waiting)

    def weigh(self, team: str, weight: float) -> None:
        """Remember a team's weight (from its latest job)."""
        self._weight[team] = weight

    def active(self, holding: Iterable[str], buffering: Iterable[str]) -> dict[str, float]:
        """Weights of the teams holding or buffering jobs now, or within the linger time. A
        team gone past the linger time is forgotten (its averages describe a past visit),
        so it comes back as a newcomer."""
        now = self._clock()
        present = {*holding, *buffering}
        for team, seen in list(self._seen.items()):
            if now - seen > self._linger_s:
                self.forget(team)
                if team not in present:  # (a returning team keeps the weight just noted)
                    del self._seen[team]
                    self._weight.pop(team, None)
        for team in present:
            self._seen[team] = now
        return {team: self._weight.get(team, 1.0) for team in self._seen}


async def watch_team_queues(
    backlog: QueueBacklog, pool: str, teams: TeamActivity, interval_s: float = 0.5
) -> None:
    """Keep ``teams`` told of the pool's interactive queue per team, every ``interval_s``
    (polling: the counters change with every admission). Failures forget the queue, so
    demand falls back to what is buffered here; the watch goes on until cancelled."""
    while True:
        try:
            teams.note_queued(await backlog.team_queued(pool, "interactive"))
        except Exception as exc:
            teams.note_queued({})
            log.warning("team_queues_unread", error=type(exc).__name__)
        await asyncio.sleep(interval_s)
