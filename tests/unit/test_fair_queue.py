"""Weighted fair queuing between teams, strict priority between classes."""

from __future__ import annotations

from collections import Counter

import pytest

from workers.fair_queue import FairQueue

INTERACTIVE, BATCH = 0, 10


def drain(q: FairQueue[str]) -> list[str]:
    out: list[str] = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def test_empty_queue() -> None:
    q: FairQueue[str] = FairQueue()
    assert q.pop() is None
    assert q.peek_priority() is None
    assert len(q) == 0
    assert q.count(INTERACTIVE) == 0
    assert q.remove(lambda _: True) == []


def test_fifo_within_a_team() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(20):
        q.push(f"a{i}", team="a", weight=1.0, cost=float(1 + i % 3), priority=INTERACTIVE)
    assert drain(q) == [f"a{i}" for i in range(20)]


@pytest.mark.parametrize("popped_before", [0, 1, 10, 500])
def test_a_flood_delays_another_team_by_about_one_item(popped_before: int) -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(1_000):
        q.push(f"a{i}", team="a", weight=1.0, cost=100.0, priority=INTERACTIVE)
    for _ in range(popped_before):
        q.pop()
    q.push("b", team="b", weight=1.0, cost=100.0, priority=INTERACTIVE)
    order = drain(q)
    assert order.index("b") <= 1


def test_a_flood_of_cheap_items_yields_to_one_expensive_item_by_cost() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(1_000):
        q.push(f"a{i}", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    q.pop()
    q.push("b", team="b", weight=1.0, cost=1_000.0, priority=INTERACTIVE)
    assert drain(q).index("b") <= 1


@pytest.mark.parametrize(
    ("weights", "costs", "share"),
    [
        ({"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, {"a": 2 / 3, "b": 1 / 3}),
        ({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, {"a": 1 / 2, "b": 1 / 2}),
        ({"a": 3.0, "b": 1.0, "c": 1.0}, {"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 0.6, "b": 0.2}),
        # equal weights, unequal item costs: service (cost) is shared, not item counts
        ({"a": 1.0, "b": 1.0}, {"a": 4.0, "b": 1.0}, {"a": 1 / 2, "b": 1 / 2}),
    ],
)
def test_backlogged_teams_share_service_by_weight(
    weights: dict[str, float], costs: dict[str, float], share: dict[str, float]
) -> None:
    q: FairQueue[str] = FairQueue()
    for _ in range(2_000):
        for name, weight in weights.items():
            q.push(name, team=name, weight=weight, cost=costs[name], priority=BATCH)
    served = dict.fromkeys(weights, 0.0)
    for _ in range(1_000):  # every team stays backlogged throughout
        team = q.pop()
        assert team is not None
        served[team] += costs[team]
    total = sum(served.values())
    for team, expected in share.items():
        assert served[team] / total == pytest.approx(expected, abs=0.01)


def test_weight_two_gets_twice_the_service_when_interleaved_with_arrivals() -> None:
    q: FairQueue[str] = FairQueue()
    served: Counter[str] = Counter()
    for _ in range(3):
        q.push("a", team="a", weight=2.0, cost=1.0, priority=INTERACTIVE)
        q.push("b", team="b", weight=1.0, cost=1.0, priority=INTERACTIVE)
    for _ in range(3_000):  # each round: one arrival per team, one item served
        q.push("a", team="a", weight=2.0, cost=1.0, priority=INTERACTIVE)
        q.push("b", team="b", weight=1.0, cost=1.0, priority=INTERACTIVE)
        team = q.pop()
        assert team is not None
        served[team] += 1
    assert served["a"] / served["b"] == pytest.approx(2.0, rel=0.01)


def test_priority_classes_are_strictly_ordered() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(5):
        q.push(f"batch{i}", team="a", weight=100.0, cost=0.0, priority=BATCH)
    q.push("i0", team="z", weight=0.01, cost=1_000.0, priority=INTERACTIVE)
    assert q.peek_priority() == INTERACTIVE
    assert q.pop() == "i0"
    assert q.peek_priority() == BATCH
    assert q.pop() == "batch0"
    q.push("i1", team="z", weight=0.01, cost=1_000.0, priority=INTERACTIVE)
    q.push("i2", team="y", weight=1.0, cost=1.0, priority=INTERACTIVE)
    assert drain(q) == ["i1", "i2", "batch1", "batch2", "batch3", "batch4"]


def test_len_and_count_track_pushes_pops_and_removals() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push(f"i{i}", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    for i in range(4):
        q.push(f"b{i}", team="a", weight=1.0, cost=1.0, priority=BATCH)
    assert (len(q), q.count(INTERACTIVE), q.count(BATCH)) == (7, 3, 4)
    q.pop()
    q.remove(lambda item: item == "b2")
    assert (len(q), q.count(INTERACTIVE), q.count(BATCH)) == (5, 2, 3)


def test_remove_returns_matches_in_arrival_order_and_keeps_the_rest() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(6):
        q.push(f"a{i}", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
        q.push(f"b{i}", team="b", weight=1.0, cost=1.0, priority=BATCH)
    removed = q.remove(lambda item: item in {"b3", "a4", "a1", "zz"})
    assert removed == ["a1", "b3", "a4"]
    assert drain(q) == ["a0", "a2", "a3", "a5", "b0", "b1", "b2", "b4", "b5"]


def test_remove_calls_the_predicate_once_per_item() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(5):
        q.push(f"a{i}", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    seen: list[str] = []

    def pred(item: str) -> bool:
        seen.append(item)
        return item == "a2"

    assert q.remove(pred) == ["a2"]
    assert sorted(seen) == [f"a{i}" for i in range(5)]


def test_removing_a_teams_flood_gives_back_its_place() -> None:
    """A cancelled flood does not leave its team's later items behind the flood's tags."""
    q: FairQueue[str] = FairQueue()
    for i in range(100):
        q.push(f"a{i}", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    q.push("a-last", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    for i in range(10):
        q.push(f"b{i}", team="b", weight=1.0, cost=1.0, priority=INTERACTIVE)
    q.remove(lambda item: item.startswith("a") and item != "a-last")
    assert drain(q)[:2] in (["a-last", "b0"], ["b0", "a-last"])
    q.push("a-next", team="a", weight=1.0, cost=1.0, priority=INTERACTIVE)
    q.push("b-next", team="b", weight=1.0, cost=1.0, priority=INTERACTIVE)
    assert drain(q) == ["a-next", "b-next"]


def test_an_emptied_class_starts_afresh() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(50):
        q.push(f"a{i}", team="a", weight=1.0, cost=1.0, priority=BATCH)
    drain(q)
    q.push("a-new", team="a", weight=1.0, cost=1.0, priority=BATCH)
    q.push("b-new", team="b", weight=1.0, cost=1.0, priority=BATCH)
    assert drain(q) == ["a-new", "b-new"]  # a's past service is not held against it


@pytest.mark.parametrize(
    ("weight", "cost"),
    [(0.0, 1.0), (-1.0, 1.0), (float("inf"), 1.0), (1.0, -1.0), (1.0, float("nan"))],
)
def test_invalid_weight_or_cost(weight: float, cost: float) -> None:
    q: FairQueue[str] = FairQueue()
    with pytest.raises(ValueError):
        q.push("x", team="a", weight=weight, cost=cost, priority=0)
    assert len(q) == 0


def test_pop_team_serves_the_first_item_of_an_allowed_team_out_of_turn() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(3):
        queue.push(f"b{i}", team="b", weight=1, cost=10, priority=0)
    queue.push("a0", team="a", weight=1, cost=10, priority=0)
    queue.push("a1", team="a", weight=1, cost=10, priority=0)
    queue.push("batch-c", team="c", weight=1, cost=10, priority=10)
    assert queue.pop_team(0, lambda team: team != "b") == "a0"
    assert queue.pop_team(0, lambda team: team == "c") is None  # c only queues batch
    assert queue.pop_team(10, lambda team: team == "c") == "batch-c"
    assert len(queue) == 4
    # a0 went early; the rest keep their tags (a1 ties with b1 and arrived later)
    assert [queue.pop() for _ in range(4)] == ["b0", "b1", "a1", "b2"]
