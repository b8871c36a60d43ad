"""Commit discipline: an offset is committed only when every job at or before it is done.

Kafka commits "the next offset to read". With jobs finishing out of order, the safe commit
point of a partition is its lowest unfinished offset (or one past the highest seen when
nothing is unfinished). A crash then re-delivers exactly the jobs that had not finished.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class _Partition:
    def __init__(self) -> None:
        self.unfinished: set[int] = set()
        self.highest_seen = -1
        self.committed: int | None = None

    def safe_point(self) -> int | None:
        if self.highest_seen < 0:
            return None
        return min(self.unfinished) if self.unfinished else self.highest_seen + 1


class OffsetTracker(Generic[P]):
    """Tracks started and finished offsets per partition and says what may be committed."""

    def __init__(self) -> None:
        self._partitions: dict[P, _Partition] = {}

    def started(self, partition: P, offset: int) -> None:
        state = self._partitions.setdefault(partition, _Partition())
        state.unfinished.add(offset)
        state.highest_seen = max(state.highest_seen, offset)

    def finished(self, partition: P, offset: int) -> None:
        state = self._partitions.get(partition)
        if state is not None:
            state.unfinished.discard(offset)

    def in_flight(self, partition: P | None = None) -> int:
        if partition is not None:
            state = self._partitions.get(partition)
            return len(state.unfinished) if state else 0
        return sum(len(s.unfinished) for s in self._partitions.values())

    def to_commit(self) -> dict[P, int]:
        """Offsets to commit now: partitions whose safe point moved since the last commit."""
        out: dict[P, int] = {}
        for partition, state in self._partitions.items():
            point = state.safe_point()
            if point is not None and point != state.committed:
                out[partition] = point
        return out

    def committed(self, offsets: dict[P, int]) -> None:
        """Record that `offsets` were committed to the broker."""
        for partition, offset in offsets.items():
            state = self._partitions.get(partition)
            if state is not None:
                state.committed = offset

    def forget(self, partition: P) -> None:
        """Drop a partition this worker no longer owns."""
        self._partitions.pop(partition, None)
