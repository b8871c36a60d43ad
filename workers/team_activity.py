"""Which teams are active on a worker, and their weights: the teams that share its slots.

A team is active while it holds or buffers a job here and for a short while after, so a team
that sends steadily keeps its share of the slots between its requests instead of losing them
to a flooding team each time its last job ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class TeamActivity:
    def __init__(self, linger_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._linger_s = linger_s
        self._clock = clock
        self._seen: dict[str, float] = {}
        self._weight: dict[str, float] = {}

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
