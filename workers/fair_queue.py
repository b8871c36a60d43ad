"""A weighted fair queue between teams, within strict priority classes.

Priority classes are strict: an item of a lower ``priority`` value (interactive 0) is always
served before any item of a higher one (batch 10).

Within a class, teams share service by start-time fair queuing (Goyal, Vin and Cheng, 1996):

- the class keeps a virtual time ``v``: the start tag of the item it served last;
- an item pushed by a team gets the start tag ``S = max(v, F_team)``, where ``F_team`` is the
  finish tag of that team's previous item in the class, and the finish tag
  ``F = S + cost / weight``;
- `pop` serves the item with the smallest start tag; ties go to the earlier arrival.

So a team's items are served in arrival order (FIFO within a team), a backlogged team with
weight 2 gets twice the service (in cost) of a backlogged weight-1 team, and a team that floods
the queue only advances its own tags: another team's item pushed later starts at ``v`` and
waits for at most about one item's ``cost / weight`` of each other backlogged team.

When a class empties, its state (virtual time and team tags) is dropped, so the memory held is
bounded by the items queued. `remove` (cancels, revoked partitions) re-tags the remaining items
of the teams it touched as if the removed items had never been pushed.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    start: float
    seq: int
    finish: float = field(compare=False)
    team: str = field(compare=False)
    weight: float = field(compare=False)
    cost: float = field(compare=False)
    v_at_push: float = field(compare=False)
    item: T = field(compare=False)


class _Class(Generic[T]):
    """One priority class: its heap, virtual time and per-team tags."""

    def __init__(self) -> None:
        self.heap: list[_Entry[T]] = []
        self.virtual_time = 0.0
        self.last_finish: dict[str, float] = {}
        """Finish tag of each team's latest pushed item (what its next start tag waits for)."""
        self.served_finish: dict[str, float] = {}
        """Finish tag of each team's latest served item (the base when re-tagging)."""

    def push(self, entry: _Entry[T]) -> None:
        heapq.heappush(self.heap, entry)
        self.last_finish[entry.team] = entry.finish

    def pop(self) -> _Entry[T]:
        entry = heapq.heappop(self.heap)
        self.virtual_time = entry.start
        self.served_finish[entry.team] = entry.finish
        return entry

    def pop_team(self, accept: Callable[[str], bool]) -> _Entry[T] | None:
        """The smallest-tagged entry of a team ``accept`` allows, served out of turn."""
        candidates = [e for e in self.heap if accept(e.team)]
        if not candidates:
            return None
        entry = min(candidates)
        self.heap.remove(entry)
        heapq.heapify(self.heap)
        self.virtual_time = max(self.virtual_time, entry.start)
        self.served_finish[entry.team] = entry.finish
        return entry

    def remove(self, predicate: Callable[[T], bool]) -> list[_Entry[T]]:
        removed: list[_Entry[T]] = []
        kept: list[_Entry[T]] = []
        for entry in self.heap:
            (removed if predicate(entry.item) else kept).append(entry)
        if not removed:
            return []
        for team in {e.team for e in removed}:
            self._retag(team, [e for e in kept if e.team == team])
        heapq.heapify(kept)
        self.heap = kept
        return sorted(removed, key=lambda e: e.seq)

    def _retag(self, team: str, remaining: list[_Entry[T]]) -> None:
        """Recompute a team's tags in arrival order, as if its removed items never came."""
        finish = self.served_finish.get(team, 0.0)
        for entry in sorted(remaining, key=lambda e: e.seq):
            entry.start = max(entry.v_at_push, finish)
            entry.finish = entry.start + entry.cost / entry.weight
            finish = entry.finish
        self.last_finish[team] = finish


class FairQueue(Generic[T]):
    """Strict priority classes; weighted fair queuing between teams within a class."""

    def __init__(self) -> None:
        self._classes: dict[int, _Class[T]] = {}
        self._seq = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, item: T, *, team: str, weight: float, cost: float, priority: int) -> None:
        """Queue ``item`` for ``team``; ``cost`` is its work (e.g. tokens), ``weight`` its share."""
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError("weight must be a positive finite number")
        if not (cost >= 0 and math.isfinite(cost)):
            raise ValueError("cost must be a non-negative finite number")
        cls = self._classes.get(priority)
        if cls is None:
            cls = self._classes[priority] = _Class()
        start = max(cls.virtual_time, cls.last_finish.get(team, 0.0))
        cls.push(
            _Entry(
                start=start,
                seq=next(self._seq),
                finish=start + cost / weight,
                team=team,
                weight=weight,
                cost=cost,
                v_at_push=cls.virtual_time,
                item=item,
            )
        )
        self._len += 1

    def peek_priority(self) -> int | None:
        """The priority of the item `pop` would return; None when empty."""
        return min(self._classes) if self._classes else None

    def pop(self) -> T | None:
        """The next item: best priority class, then smallest start tag, then arrival."""
        priority = self.peek_priority()
        if priority is None:
            return None
        cls = self._classes[priority]
        entry = cls.pop()
        if not cls.heap:
            del self._classes[priority]
        self._len -= 1
        return entry.item

    def pop_team(self, priority: int, accept: Callable[[str], bool]) -> T | None:
        """The next item of one class among the teams ``accept`` allows (e.g. teams that hold
        no running job); None if there is none. Within those teams, fair order holds."""
        cls = self._classes.get(priority)
        entry = cls.pop_team(accept) if cls else None
        if cls is None or entry is None:
            return None
        if not cls.heap:
            del self._classes[priority]
        self._len -= 1
        return entry.item

    def count(self, priority: int) -> int:
        """Items queued in one priority class."""
        cls = self._classes.get(priority)
        return len(cls.heap) if cls else 0

    def items(self) -> list[T]:
        """Every queued item (in no particular order)."""
        return [entry.item for cls in self._classes.values() for entry in cls.heap]

    def remove(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return (in arrival order) every item for which ``predicate`` is true."""
        removed: list[_Entry[T]] = []
        for priority in list(self._classes):
            cls = self._classes[priority]
            removed.extend(cls.remove(predicate))
            if not cls.heap:
                del self._classes[priority]
        self._len -= len(removed)
        removed.sort(key=lambda e: e.seq)
        return [e.item for e in removed]
