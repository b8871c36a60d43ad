"""The per-replica half of the TTFT prediction: slots played forward, sends since a heartbeat,
the weighted fit, and the slot ends a worker reports."""

from __future__ import annotations

import pytest

from gateway.services.replica_wait import (
    RecentSends,
    ReplicaSends,
    jobs_ahead,
    replica_wait,
    slot_wait_s,
)
from gateway.services.wait_fit import WaitFit
from schemas.heartbeat import ReplicaHeartbeat
from tests.unit.test_step_time import FakeClock, job
from workers.load import LoadTracker


def beat(**fields: object) -> ReplicaHeartbeat:
    values: dict[str, object] = {
        "replica_id": "r",
        "pool": "p",
        "model": "m",
        "state": "ready",
        "max_num_seqs": 3,
        "mean_job_s": 1.0,
        "sent_at": 100.0,
    }
    values.update(fields)
    return ReplicaHeartbeat.model_validate(values)


def test_a_free_slot_means_no_wait() -> None:
    replica = beat(in_flight=2, slot_free_in_s=(0.4, 0.9))
    assert slot_wait_s(replica, now=100.0, jobs_ahead=0) == 0.0
    # one job ahead takes the free slot; the next frees 0.4 s after the heartbeat
    assert slot_wait_s(replica, now=100.0, jobs_ahead=1) == pytest.approx(0.4)
    # the heartbeat is 0.1 s old: that end is 0.1 s nearer
    assert slot_wait_s(replica, now=100.1, jobs_ahead=1) == pytest.approx(0.3)


def test_jobs_ahead_hold_the_slots_they_take_for_the_mean_job_time() -> None:
    replica = beat(in_flight=3, slot_free_in_s=(0.2, 0.5, 0.7))
    # ahead: three jobs take the slots freeing at 0.2, 0.5, 0.7 and hold them 1 s each
    assert slot_wait_s(replica, now=100.0, jobs_ahead=3) == pytest.approx(1.2)
    # ends in the past count as free now
    assert slot_wait_s(replica, now=101.0, jobs_ahead=0) == 0.0


def test_sequences_beyond_a_lowered_cap_must_end_first() -> None:
    # four run but the TPOT cap allows two: two must end before one can start
    replica = beat(max_num_seqs=2, in_flight=4, slot_free_in_s=(0.1, 0.2, 0.3, 0.4))
    assert slot_wait_s(replica, now=100.0, jobs_ahead=0) == pytest.approx(0.3)


def test_no_slot_prediction_without_timed_ends() -> None:
    assert slot_wait_s(beat(in_flight=2), now=100.0, jobs_ahead=0) is None  # not timed yet
    assert slot_wait_s(beat(max_num_seqs=0), now=100.0, jobs_ahead=0) is None
    assert slot_wait_s(beat(), now=100.0, jobs_ahead=0) == 0.0  # idle: nothing to time


def test_replica_wait_adds_the_prompts_ahead() -> None:
    replica = beat(
        in_flight=3, buffered={"a": 1}, prefill_waiting_tokens=500, slot_free_in_s=(0.2,) * 3
    )
    sent = RecentSends({"a": 1}, 1_500)
    wait = replica_wait(replica, now=100.0, sent=sent, prefill_tokens_per_s=1_000, team="a")
    assert wait is not None
    assert wait.slot_s == pytest.approx(0.2)  # two ahead (buffered + sent) take 0.2 s slots
    assert wait.prefill_ahead_s == pytest.approx(2.0)  # 2,000 tokens at 1,000/s
    assert wait.running == 3
    started = RecentSends({"a": 1}, 1_500, started=1)
    later = replica_wait(replica, now=100.0, sent=started, prefill_tokens_per_s=1_000, team="a")
    assert later is not None and later.running == 3 + 1  # and the one started since


def test_sends_since_a_heartbeat() -> None:
    sends = ReplicaSends()
    sends.record("r", 10.0, "a", 100)
    sends.record("r", 11.0, "b", 200)
    sends.record("r", 11.2, "b", 10)
    sends.record("other", 11.5, "a", 50)
    assert sends.since("r", 10.5) == RecentSends({"b": 2}, 210)
    assert sends.since("r", 9.0) == RecentSends({"a": 1, "b": 2}, 310)
    assert sends.since("r", 11.2) == RecentSends()
    assert sends.since("unknown", 0.0) == RecentSends()
    sends.record("r", 11.3, "b", 5, "started-one")
    sends.started("started-one")  # its first token came back: it waits no more
    assert sends.since("r", 11.2) == RecentSends(started=1)  # but holds a slot
    sends.record("r", 60.0, "a", 1)  # older than 30 s: forgotten
    assert sends.since("r", 0.0) == RecentSends({"a": 1}, 1)


def test_fair_queuing_decides_who_is_ahead() -> None:
    # a flooding team's backlog is not ahead of a steady team's first job, only one of it
    assert jobs_ahead({"flood": 40}, "steady") == 1
    assert jobs_ahead({"flood": 40, "steady": 2}, "steady") == 2 + 3
    assert jobs_ahead({"flood": 40, "steady": 2}, "flood") == 40 + 2
    assert jobs_ahead({}, "a") == 0


def test_the_fit_learns_overhead_and_both_factors() -> None:
    fit = WaitFit()
    line = fit.line("p", 0.05)
    assert (line.overhead_s, line.slot_factor, line.prefill_factor) == (0.05, 1.0, 1.0)
    # slot waits are served at 1.2x, prompts ahead cost a tenth of their prefill time
    for i in range(200):
        slot, prefill = (i % 7) * 0.05, (i % 5) * 0.02
        actual = 0.03 + 1.2 * slot + 0.1 * prefill
        fit.observe(
            "p",
            slot_wait_s=slot,
            prefill_ahead_s=prefill,
            own_prefill_s=0.0,
            actual_s=actual,
            default_overhead_s=0.05,
        )
    line = fit.line("p", 0.05)
    assert line.overhead_s == pytest.approx(0.03, abs=0.003)
    assert line.slot_factor == pytest.approx(1.2, abs=0.02)
    assert line.prefill_factor == pytest.approx(0.1, abs=0.1)  # the prior pulls towards 1
    assert fit.spread_log("p") < 0.05
    assert fit.line("other", 0.05).overhead_s == 0.05  # pools learn apart


def test_a_changed_prefill_rate_is_not_counted_twice() -> None:
    """The replica's rate starts as a fallback (a 45-token prompt's prefill looks like 20 ms)
    and is then measured on a CPU engine (1.1 s, the step's fixed cost folded in); the same
    requests keep taking 1.2 s. The overhead learnt first must not be added to the new
    prefill."""
    fit = WaitFit()
    for _ in range(3):
        fit.observe(
            "p", own_prefill_s=0.02, slot_wait_s=0.0, prefill_ahead_s=0.0, actual_s=1.2,
            default_overhead_s=0.05,
        )  # fmt: skip
    for _ in range(3):
        fit.observe(
            "p", own_prefill_s=1.1, slot_wait_s=0.0, prefill_ahead_s=0.0, actual_s=1.2,
            default_overhead_s=0.05,
        )  # fmt: skip
    line = fit.line("p", 0.05)
    assert line.ttft_s(1.1, 0.0, 0.0) == pytest.approx(1.2, rel=0.1)  # not 1.1 + 1.18
    # Prompts of different lengths at a steady rate teach a factor near 1.
    steady = WaitFit()
    for i in range(200):
        own = 0.05 + (i % 6) * 0.1
        steady.observe(
            "p", own_prefill_s=own, slot_wait_s=0.0, prefill_ahead_s=0.0, actual_s=0.03 + own,
            default_overhead_s=0.05,
        )  # fmt: skip
    assert steady.line("p", 0.05).own_factor == pytest.approx(1.0, abs=0.05)
    assert steady.line("p", 0.05).overhead_s == pytest.approx(0.03, abs=0.01)


def test_the_first_requests_miss_of_the_defaults_is_not_the_fits_spread() -> None:
    """A CPU engine's first request takes 1.6 s where the defaults say 70 ms: the fit
    learns from it, but its miss (a factor of 23) would hold the margin at its widest."""
    fit = WaitFit()
    for actual in (1.6, 1.5, 1.6, 1.55):
        fit.observe(
            "p", own_prefill_s=0.02, slot_wait_s=0.0, prefill_ahead_s=0.0, actual_s=actual,
            default_overhead_s=0.05,
        )  # fmt: skip
    assert fit.line("p", 0.05).ttft_s(0.02, 0.0, 0.0) == pytest.approx(1.56, rel=0.05)
    assert fit.spread_log("p") < 0.1


def test_the_fit_learns_what_each_running_sequence_adds() -> None:
    """A CPU engine: a request arriving among n decoding streams waits about 0.3 s per
    stream for the step its prefill shares, with no slot wait and nothing ahead of it."""
    fit = WaitFit()
    for i in range(300):
        running, slot = i % 9, (i % 4) * 0.1
        actual = 0.05 + slot + 0.3 * running
        fit.observe(
            "p",
            slot_wait_s=slot,
            prefill_ahead_s=0.0,
            own_prefill_s=0.0,
            actual_s=actual,
            default_overhead_s=0.05,
            running=running,
        )
    line = fit.line("p", 0.05)
    assert line.decode_s == pytest.approx(0.3, rel=0.05)
    assert line.slot_factor == pytest.approx(1.0, abs=0.1)
    assert line.overhead_s == pytest.approx(0.05, abs=0.03)
    assert line.ttft_s(0.0, 0.0, 0.0, 8) == pytest.approx(2.45, rel=0.05)
    assert fit.spread_log("p") < 0.1


def test_a_steady_running_count_teaches_no_decode_cost() -> None:
    """A GPU replica that always runs 8 sequences: nothing tells a decode cost from the
    overhead, and the overhead carries it all (the decode term stays at 0)."""
    fit = WaitFit()
    for i in range(200):
        slot = (i % 5) * 0.02
        actual = 0.04 + slot
        fit.observe(
            "p",
            slot_wait_s=slot,
            prefill_ahead_s=0.0,
            own_prefill_s=0.0,
            actual_s=actual,
            default_overhead_s=0.05,
            running=8,
        )
    line = fit.line("p", 0.05)
    assert line.decode_s == pytest.approx(0.0, abs=1e-3)
    assert line.ttft_s(0.0, 0.0, 0.0, 8) == pytest.approx(0.04, abs=0.005)


def test_the_fit_weighs_relative_errors() -> None:
    """A few long, unpredicted waits barely move the overhead that short TTFTs show."""
    fit = WaitFit()
    for i in range(100):
        actual = 0.5 if i % 10 == 0 else 0.03  # every tenth waited unforeseen
        fit.observe(
            "p",
            slot_wait_s=0.0,
            prefill_ahead_s=0.0,
            own_prefill_s=0.0,
            actual_s=actual,
            default_overhead_s=0.05,
        )
    assert fit.line("p", 0.05).overhead_s < 0.04  # the unweighted mean would be 0.077
    assert fit.spread_log("p") > 0.2  # and the spread shows the misses, for the margin


def test_a_few_early_starts_do_not_pull_the_slot_factor_down() -> None:
    """The CPU stack at 6 requests/s: slot waits of 0.3-1.3 s came true (actual = overhead +
    prefill + slot wait), but one request in eight started at once although its heartbeat
    said a slot was that far away (a job ended early). Weighed by 1 / actual^2, each early
    start outweighed 60 true waits and the slot factor fell to its floor; the requests that
    waited a second were predicted at a third of it."""
    fit = WaitFit()
    for i in range(400):
        slot = 0.3 + (i % 6) * 0.2
        actual = 0.12 if i % 8 == 0 else 0.05 + 0.07 + slot
        fit.observe(
            "p", own_prefill_s=0.07, slot_wait_s=slot, prefill_ahead_s=0.0, actual_s=actual,
            default_overhead_s=0.05,
        )  # fmt: skip
    line = fit.line("p", 0.05)
    assert line.slot_factor > 0.7  # weighed by the actual alone: 0.25, the floor
    # a request behind a one-second slot wait is predicted at most 25% short of it
    assert line.ttft_s(0.07, 1.0, 0.0) > 0.75 * (0.05 + 0.07 + 1.0)


def test_a_worker_reports_when_its_jobs_will_end() -> None:
    clock = FakeClock()
    tracker = LoadTracker(clock=clock)
    tracker.started(job("a", prompt=100, max_tokens=10))
    assert tracker.prefill_waiting_tokens() == 100
    clock.now += 0.1
    tracker.produced("a", 1, 0)
    for _ in range(4):
        clock.now += 0.02
        tracker.produced("a", 1, 0)  # 5 of 10 tokens at 20 ms each
    # timed, but no job has finished: its output could only be guessed as max_tokens
    assert tracker.slot_ends_in_s() == ()
    tracker.started(job("done", prompt=100, max_tokens=50))
    clock.now += 0.1  # its prefill: 1,000 tokens/s, as "a"'s
    for _ in range(50):
        tracker.produced("done", 1, 0)
        clock.now += 0.02
    tracker.finished("done")  # recent jobs produce 50 tokens
    tracker.started(job("b", prompt=400, max_tokens=4))
    ends = tracker.slot_ends_in_s()
    # "a": 5 tokens left (of max_tokens 10) at 20 ms; "b": 4 tokens plus its prefill (100
    # tokens in 0.1 s: 1,000/s)
    assert ends == pytest.approx((5 * 0.02, 4 * 0.02 + 400 / 1_000), rel=0.05)
    assert tracker.prefill_waiting_tokens() == 400


def test_expected_outputs_follow_recent_jobs_not_a_huge_max_tokens() -> None:
    clock = FakeClock()
    tracker = LoadTracker(clock=clock)
    for n in range(10):  # ten jobs that stopped after 3 tokens of 1,000 allowed
        tracker.started(job(f"done{n}", max_tokens=1_000))
        for _ in range(3):
            clock.now += 0.01
            tracker.produced(f"done{n}", 1, 0)
        tracker.finished(f"done{n}")
    tracker.started(job("new", max_tokens=1_000))
    clock.now += 0.01
    tracker.produced("new", 1, 0)
    (end,) = tracker.slot_ends_in_s()
    assert end == pytest.approx(2 * 0.01, abs=0.002)  # 3 expected, 1 produced


def test_a_team_alone_leaves_the_reserve_free() -> None:
    replica = beat(in_flight=2, slot_free_in_s=(0.4, 0.9), slot_reserve=1, teams_running=("a",))
    assert slot_wait_s(replica, now=100.0, jobs_ahead=0, team="b") == 0.0  # the reserve
    assert slot_wait_s(replica, now=100.0, jobs_ahead=0, team="a") == pytest.approx(0.4)
    shared = beat(in_flight=2, slot_free_in_s=(0.4, 0.9), slot_reserve=1, teams_running=("a", "b"))
    assert slot_wait_s(shared, now=100.0, jobs_ahead=0, team="a") == 0.0  # may take it


def test_a_team_the_worker_lets_start_now_does_not_wait_for_a_slot() -> None:
    # every slot busy for a while, but the flooding team must leave the reserve to the other
    replica = beat(
        in_flight=3,
        slot_free_in_s=(0.5, 0.6, 0.7),
        buffered={"flood": 30},
        startable={"flood": 0, "steady": 1, "": 1},
    )
    steady = replica_wait(
        replica, now=100.0, sent=RecentSends(), prefill_tokens_per_s=1e9, team="steady"
    )
    newcomer = replica_wait(
        replica, now=100.0, sent=RecentSends(), prefill_tokens_per_s=1e9, team="new"
    )
    flood = replica_wait(
        replica, now=100.0, sent=RecentSends(), prefill_tokens_per_s=1e9, team="flood"
    )
    assert steady is not None and newcomer is not None and flood is not None
    assert steady.slot_s == 0.0 and newcomer.slot_s == 0.0
    assert flood.slot_s > 1.0  # behind its own 30 jobs
    # the steady team's one startable slot is taken by its job sent since the heartbeat
    busier = replica_wait(
        replica,
        now=100.0,
        sent=RecentSends({"steady": 1}, 0),
        prefill_tokens_per_s=1e9,
        team="steady",
    )
    assert busier is not None and busier.slot_s > 0.0


def test_short_ttfts_scatter_does_not_widen_the_margin_of_long_predictions() -> None:
    """On a CPU engine a 0.2 s TTFT scatters by +-50% (one engine step is a third of it);
    requests that waited 0.6 s for a slot came within 10%. The margin decides for the long
    ones only, and its spread is theirs: weighed alike, the short ones made it 0.34."""
    fit = WaitFit()
    for i in range(120):
        short = 0.1 if i % 4 == 0 else 0.3
        fit.observe(
            "p", own_prefill_s=0.15, slot_wait_s=0.0, prefill_ahead_s=0.0,
            actual_s=short, default_overhead_s=0.05,
        )  # fmt: skip
        long = 0.65 + (0.05 if i % 2 else -0.05)
        fit.observe(
            "p", own_prefill_s=0.15, slot_wait_s=0.5, prefill_ahead_s=0.0,
            actual_s=long, default_overhead_s=0.05,
        )  # fmt: skip
    assert fit.spread_log("p") < 0.2
    for _ in range(10):  # long predictions that started at once (a slot freed early)
        fit.observe(
            "p", own_prefill_s=0.15, slot_wait_s=0.5, prefill_ahead_s=0.0,
            actual_s=0.15, default_overhead_s=0.05,
        )  # fmt: skip
    assert fit.spread_log("p") < 0.3  # weighed by the prediction alone, they made it 0.74
