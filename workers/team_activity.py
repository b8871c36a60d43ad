"""Which teams are active on a worker, and their weights: the teams that share its slots.

A team is active while it holds or buffers a job here and for a short while after, so a team
that sends steadily keeps its share of the slots between its requests instead of losing them
to a flooding team each time its last job ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping


class TeamActivity:
    def __init__(
        self,
        linger_s: float,
        clock: Callable[[], float] = time.monotonic,
        usage_window_s: float = 10.0,
    ) -> None:
        self._linger_s = linger_s
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        self._window_s = usage_window_s
        self._usage: dict[str, float] = {}
        self._usage_at: float | None = None

    def usage(self, held: Mapping[str, int]) -> dict[str, float]:
        """Slots each team held on average lately (an exponential moving average over
        ``usage_window_s``), updated with what they hold now. A team using less than its share
        on average is a light sender: it may burst past its share (see `HeadroomPolicy`)."""
        now = self._clock()
        decay = (
            1.0 if self._usage_at is None else math.exp(-(now - self._usage_at) / self._window_s)
        )
        self._usage_at = now
        for team in {*self._usage, *held}:
            current = self._usage.get(team, float(held.get(team, 0)))
            updated = held.get(team, 0) + (current - held.get(team, 0)) * decay
            if updated < 0.01 and team not in held:
                self._usage.pop(team, None)
            else:
                self._usage[team] = updated
        return dict(self._usage)

    def weigh(self, team: str, weight: float) -> None:
        """Remember a team's weight (from its latest job)."""
        self._weight[team] = weight

    def active(self, holding: Iterable[str], buffering: Iterable[str]) -> dict[str, float]:
        """Weights of the teams holding or buffering jobs now, or within the linger time."""
        now = self._clock()
        for team in (*holding, *buffering):
            self._seen[team] = now
        for team, seen in list(self._seen.items()):
            if now - seen > self._linger_s:
                del self._seen[team]
                self._weight.pop(team, None)
        return {team: self._weight.get(team, 1.0) for team in self._seen}
