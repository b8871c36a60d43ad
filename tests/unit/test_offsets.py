"""Commit discipline: the commit point never passes an unfinished job."""

from __future__ import annotations

from workers.offsets import OffsetTracker


def test_nothing_to_commit_before_any_job() -> None:
    assert OffsetTracker[str]().to_commit() == {}


def test_commit_point_waits_for_the_lowest_unfinished_offset() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    for offset in (10, 11, 12):
        t.started("p0", offset)
    assert t.to_commit() == {"p0": 10}
    t.finished("p0", 12)
    t.finished("p0", 11)
    assert t.to_commit() == {"p0": 10}  # 10 still runs: a crash must re-deliver it
    t.finished("p0", 10)
    assert t.to_commit() == {"p0": 13}


def test_committed_points_are_not_repeated() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.started("p0", 0)
    t.finished("p0", 0)
    t.committed(t.to_commit())
    assert t.to_commit() == {}
    t.started("p0", 1)
    assert t.to_commit() == {}  # still 1: unchanged since the last commit
    t.finished("p0", 1)
    assert t.to_commit() == {"p0": 2}


def test_partitions_are_independent_and_forgettable() -> None:
    t: OffsetTracker[str] = OffsetTracker()
    t.started("a", 5)
    t.started("b", 7)
    t.finished("b", 7)
    assert t.to_commit() == {"a": 5, "b": 8}
    assert t.in_flight() == 1 and t.in_flight("a") == 1
    t.forget("a")
    assert t.to_commit() == {"b": 8}
