"""When a worker may stop polling: every partition fetched empty since the last announcement."""

from __future__ import annotations

from workers.caught_up import CaughtUp

SETTLE_S, SAFETY_S = 0.03, 0.5
BOTH = ("p0", "p1")


def settled() -> CaughtUp[str]:
    caught_up: CaughtUp[str] = CaughtUp(SETTLE_S, SAFETY_S)
    caught_up.fetched(BOTH, {}, started_at=0.0, now=0.05)
    return caught_up


def test_partitions_fetched_empty_for_the_settle_time_are_caught_up() -> None:
    caught_up: CaughtUp[str] = CaughtUp(SETTLE_S, SAFETY_S)
    assert not caught_up.quiet(BOTH, now=0.0)
    caught_up.fetched(BOTH, {}, started_at=0.0, now=0.01)  # too short to be sure
    assert not caught_up.quiet(BOTH, now=0.01)
    caught_up.fetched(BOTH, {}, started_at=0.01, now=0.04)  # empty since 0.0: 40 ms
    assert caught_up.quiet(BOTH, now=0.04)
    assert caught_up.quiet_for(now=0.14) == 0.4


def test_a_partition_that_brought_records_is_fetched_again() -> None:
    caught_up: CaughtUp[str] = CaughtUp(SETTLE_S, SAFETY_S)
    caught_up.fetched(BOTH, {"p1": 2}, started_at=0.0, now=0.05)
    assert not caught_up.quiet(BOTH, now=0.05)
    assert caught_up.quiet_for(now=0.05) is None
    caught_up.fetched(BOTH, {}, started_at=0.05, now=0.1)
    assert caught_up.quiet(BOTH, now=0.1)


def test_an_announcement_ends_the_quiet_and_discounts_fetches_begun_before_it() -> None:
    caught_up = settled()
    assert caught_up.quiet(BOTH, now=0.05)
    caught_up.announced(now=0.06)
    assert not caught_up.quiet(BOTH, now=0.06)
    # A fetch that began before the announcement may have missed the announced job.
    caught_up.fetched(BOTH, {}, started_at=0.055, now=0.2)
    assert not caught_up.quiet(BOTH, now=0.2)
    caught_up.fetched(BOTH, {}, started_at=0.2, now=0.25)
    assert caught_up.quiet(BOTH, now=0.25)


def test_a_partition_not_yet_fetched_keeps_the_worker_polling() -> None:
    caught_up = settled()
    assert not caught_up.quiet((*BOTH, "p2"), now=0.05)  # newly assigned: unknown
    caught_up.fetched(("p2",), {}, started_at=0.05, now=0.1)
    assert caught_up.quiet((*BOTH, "p2"), now=0.1)


def test_a_paused_partition_restarts_its_settle_time_but_stays_caught_up() -> None:
    caught_up: CaughtUp[str] = CaughtUp(SETTLE_S, SAFETY_S)
    caught_up.fetched(("p0",), {}, started_at=0.0, now=0.02)
    caught_up.not_fetched(("p0",))  # no room for a turn: the run of empty fetches breaks
    caught_up.fetched(("p0",), {}, started_at=0.03, now=0.05)
    assert not caught_up.quiet(("p0",), now=0.05)  # 20 ms since the break: not yet
    caught_up.fetched(("p0",), {}, started_at=0.05, now=0.07)
    assert caught_up.quiet(("p0",), now=0.07)
    caught_up.not_fetched(("p0",))
    assert caught_up.quiet(("p0",), now=0.08)  # nothing announced: still caught up


def test_the_safety_poll_fetches_everything_again() -> None:
    caught_up = settled()
    assert caught_up.quiet(BOTH, now=0.1)
    assert caught_up.quiet(BOTH, now=0.1 + SAFETY_S - 0.01)
    assert not caught_up.quiet(BOTH, now=0.1 + SAFETY_S)  # as if a job had been announced
    assert not caught_up.quiet(BOTH, now=0.7)


def test_without_a_safety_interval_it_never_goes_quiet() -> None:
    caught_up: CaughtUp[str] = CaughtUp(SETTLE_S, None)
    caught_up.fetched(BOTH, {}, started_at=0.0, now=1.0)
    assert not caught_up.quiet(BOTH, now=1.0)
    assert not caught_up.quiet((), now=1.0)
