"""When a worker may stop polling the broker: pure logic, no clock or Kafka of its own.

Every producer of jobs (the gateway, the batch service, `llmq replay`, a worker re-queuing a
job) announces each job on its pool's wake channel once the broker has acknowledged it. So a
partition that a worker has fetched and found empty holds nothing new until the next
announcement. Once every assigned partition has been fetched continuously and found empty for
`settle_s` (long enough for a fetch sent after the last announcement to have come back), the
worker is caught up: it pauses its partitions, and so sends the broker nothing, whether it is
idle or busy generating, until a job is announced, its assignment changes, or
`safety_interval_s` passes (an announcement lost while Redis was away costs a job at most that
long).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)  # a partition (aiokafka's TopicPartition in the worker)


class CaughtUp(Generic[P]):
    def __init__(self, settle_s: float, safety_interval_s: float | None) -> None:
        """`safety_interval_s` None: never stop polling."""
        self._settle_s = settle_s
        self._safety_interval_s = safety_interval_s
        self._empty_since: dict[P, float] = {}
        """Partitions fetched continuously and found empty since the given time."""
        self._caught_up: set[P] = set()
        self._quiet_since: float | None = None
        self._announced_at = float("-inf")

    def announced(self, now: float) -> None:
        """A job was queued for the pool (or the assignment changed): any partition may hold
        it, so all are fetched again."""
        self._announced_at = now
        self._empty_since.clear()
        self._caught_up.clear()
        self._quiet_since = None

    def fetched(self, resumed: Collection[P], records: Mapping[P, int], started_at: float,
                now: float) -> None:  # fmt: skip
        """A fetch that ran from `started_at` to `now` over the `resumed` partitions brought
        `records` (count per partition; none for an empty one). A fetch that began before
        the last announcement proves nothing empty."""
        for tp in resumed:
            if records.get(tp):
                self._empty_since.pop(tp, None)
                self._caught_up.discard(tp)
                continue
            if started_at < self._announced_at:
                continue
            since = self._empty_since.setdefault(tp, started_at)
            if now - since >= self._settle_s:
                self._caught_up.add(tp)

    def not_fetched(self, partitions: Collection[P]) -> None:
        """Partitions paused for a turn (no room): their run of empty fetches is broken, but a
        caught-up partition stays caught up (nothing was announced)."""
        for tp in partitions:
            self._empty_since.pop(tp, None)

    def quiet(self, assignment: Collection[P], now: float) -> bool:
        """Whether to send no fetch now: every assigned partition is caught up, and the safety
        interval since going quiet has not passed (once it has, all are fetched again)."""
        if self._safety_interval_s is None or not assignment:
            return False
        if not all(tp in self._caught_up for tp in assignment):
            self._quiet_since = None
            return False
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since >= self._safety_interval_s:
            self.announced(now)  # a safety poll: as if a job had been announced
            return False
        return True

    def quiet_for(self, now: float) -> float | None:
        """Seconds of quiet left before the safety poll (None: not quiet)."""
        if self._quiet_since is None or self._safety_interval_s is None:
            return None
        return max(0.0, self._quiet_since + self._safety_interval_s - now)
