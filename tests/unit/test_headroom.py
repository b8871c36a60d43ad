"""Headroom: start (and fetch) only what the engine can run; interactive preempts batch."""

from __future__ import annotations

import pytest

from schemas.chat import Tier
from workers.engine.port import EngineStats
from workers.headroom import (
    EngineLoad,
    FetchBudget,
    HeadroomPolicy,
    RunningJob,
    choose_victim,
)

POLICY = HeadroomPolicy()
CAP = 100_000  # KV capacity tokens in these tests


def load(**kw: float) -> EngineLoad:
    base: dict[str, float] = {
        "in_flight": 4,
        "max_num_seqs": 8,
        "kv_cache_usage": 0.2,
        "kv_capacity_tokens": CAP,
        "reserved_tokens": 0,
        "interactive_backlog": 0,
        "batch_in_flight": 0,
    }
    base.update(kw)
    return EngineLoad(
        in_flight=int(base["in_flight"]),
        max_num_seqs=int(base["max_num_seqs"]),
        kv_cache_usage=base["kv_cache_usage"],
        kv_capacity_tokens=int(base["kv_capacity_tokens"]),
        reserved_tokens=int(base["reserved_tokens"]),
        interactive_backlog=int(base["interactive_backlog"]),
        batch_in_flight=int(base["batch_in_flight"]),
    )


@pytest.mark.parametrize(
    ("in_flight", "max_num_seqs", "free"),
    [(0, 8, 8), (3, 8, 5), (8, 8, 0), (11, 8, 0)],
)
def test_free_slots(in_flight: int, max_num_seqs: int, free: int) -> None:
    assert POLICY.free_slots(load(in_flight=in_flight, max_num_seqs=max_num_seqs)) == free


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "tokens"),
    [(100, 0, 100), (100, 200, 200), (100, 201, 201), (0, 1, 1), (4096, 8192, 8192)],
)
def test_job_tokens_reserve_prompt_plus_expected_output(
    prompt: int, max_tokens: int, tokens: int
) -> None:
    assert POLICY.job_tokens(prompt, max_tokens) == tokens


def test_job_tokens_follow_the_configured_fraction() -> None:
    assert HeadroomPolicy(expected_output_fraction=1.0).job_tokens(10, 50) == 60
    assert HeadroomPolicy(expected_output_fraction=0.0).job_tokens(10, 50) == 10
    with pytest.raises(ValueError):
        POLICY.job_tokens(-1, 10)


@pytest.mark.parametrize(
    ("kw", "tokens", "tier", "ok"),
    [
        # slots
        ({}, 1_000, "interactive", True),
        ({"in_flight": 8}, 1, "interactive", False),
        ({"in_flight": 8}, 1, "batch", False),
        # interactive KV room: (0.95 - 0.2) * 100k = 75k
        ({}, 75_000, "interactive", True),
        ({}, 75_001, "interactive", False),
        ({"reserved_tokens": 5_000}, 70_001, "interactive", False),
        ({"reserved_tokens": 5_000}, 70_000, "interactive", True),
        ({"kv_cache_usage": 0.96}, 1, "interactive", False),
        # unknown capacity: only slots count
        ({"kv_capacity_tokens": 0, "kv_cache_usage": 0.99}, 10**9, "interactive", True),
        # batch KV room: (0.70 - 0.2) * 100k = 50k
        ({}, 50_000, "batch", True),
        ({}, 50_001, "batch", False),
        ({"kv_cache_usage": 0.70}, 1, "batch", False),
        ({"kv_cache_usage": 0.69, "reserved_tokens": 1_000}, 1, "batch", False),
        ({"kv_capacity_tokens": 0, "kv_cache_usage": 0.70}, 1, "batch", False),
        ({"kv_capacity_tokens": 0, "kv_cache_usage": 0.69}, 10**9, "batch", True),
        # batch waits while any interactive job waits
        ({"interactive_backlog": 1}, 1, "batch", False),
        ({"interactive_backlog": 1}, 1, "interactive", True),
        # an idle engine takes any job its class gates allow
        ({"in_flight": 0, "kv_cache_usage": 0.0}, 10**9, "interactive", True),
        ({"in_flight": 0, "kv_cache_usage": 0.0}, 10**9, "batch", True),
        ({"in_flight": 0, "interactive_backlog": 2}, 1, "batch", False),
    ],
)
def test_can_start(kw: dict[str, float], tokens: int, tier: Tier, ok: bool) -> None:
    assert POLICY.can_start(load(**kw), tokens, tier) is ok


@pytest.mark.parametrize(
    ("kw", "typical", "budget"),
    [
        ({}, 0, FetchBudget(interactive=4, batch=4)),
        ({"in_flight": 8}, 0, FetchBudget(interactive=0, batch=0)),
        # an interactive job waits: no batch
        ({"interactive_backlog": 3}, 0, FetchBudget(interactive=4, batch=0)),
        # at the watermark: interactive only
        ({"kv_cache_usage": 0.7}, 0, FetchBudget(interactive=4, batch=0)),
        # no interactive KV room either
        ({"kv_cache_usage": 0.95}, 0, FetchBudget(interactive=0, batch=0)),
        # capped by how many typical jobs fit: 75k / 20k = 3 interactive, 50k / 20k = 2 batch
        ({}, 20_000, FetchBudget(interactive=3, batch=2)),
        ({}, 60_000, FetchBudget(interactive=1, batch=0)),
        ({"kv_capacity_tokens": 0}, 60_000, FetchBudget(interactive=4, batch=4)),
        # full of batch: one interactive fetch per batch job preemption could free, whether
        # or not interactive work is known to wait (a paused partition cannot tell)
        (
            {"in_flight": 8, "batch_in_flight": 6, "interactive_backlog": 2},
            0,
            FetchBudget(interactive=6, batch=0),
        ),
        (
            {"in_flight": 8, "batch_in_flight": 1, "interactive_backlog": 5},
            0,
            FetchBudget(interactive=1, batch=0),
        ),
        (
            {"in_flight": 8, "batch_in_flight": 3},
            0,
            FetchBudget(interactive=3, batch=0),
        ),
        (
            {"in_flight": 6, "batch_in_flight": 6, "interactive_backlog": 5},
            0,
            FetchBudget(interactive=8, batch=0),
        ),
        # idle engine: every slot
        ({"in_flight": 0, "kv_cache_usage": 0.0}, 10**9, FetchBudget(interactive=8, batch=8)),
    ],
)
def test_fetch_budget(kw: dict[str, float], typical: int, budget: FetchBudget) -> None:
    got = POLICY.fetch_budget(load(**kw), typical_job_tokens=typical)
    assert got == budget
    assert got.batch <= got.interactive == got.total


@pytest.mark.parametrize(
    ("kw", "tokens", "tier", "needed"),
    [
        ({"in_flight": 8, "batch_in_flight": 1}, 1, "interactive", True),
        ({"in_flight": 8, "batch_in_flight": 0}, 1, "interactive", False),  # nothing to preempt
        ({"in_flight": 8, "batch_in_flight": 3}, 1, "batch", False),  # batch never preempts
        ({"batch_in_flight": 2}, 1, "interactive", False),  # it can start: no preemption
        ({"batch_in_flight": 2, "kv_cache_usage": 0.95}, 1, "interactive", True),  # no KV room
        ({"batch_in_flight": 2}, 80_000, "interactive", True),  # this job does not fit
    ],
)
def test_preemption_needed(kw: dict[str, float], tokens: int, tier: Tier, needed: bool) -> None:
    assert POLICY.preemption_needed(load(**kw), tier, tokens) is needed


def job(rid: str, tier: Tier, started_at: float, done: int) -> RunningJob:
    return RunningJob(request_id=rid, tier=tier, started_at=started_at, tokens_done=done)


@pytest.mark.parametrize(
    ("running", "victim"),
    [
        ([], None),
        ([job("i1", "interactive", 1.0, 0)], None),
        ([job("i1", "interactive", 1.0, 0), job("b1", "batch", 0.5, 900)], "b1"),
        ([job("b1", "batch", 1.0, 50), job("b2", "batch", 2.0, 10)], "b2"),
        ([job("b1", "batch", 3.0, 10), job("b2", "batch", 2.0, 10)], "b1"),  # tie: latest
        (
            [
                job("i1", "interactive", 9.0, 0),
                job("b1", "batch", 1.0, 5),
                job("b2", "batch", 2.0, 0),
                job("b3", "batch", 3.0, 0),
            ],
            "b3",
        ),
    ],
)
def test_choose_victim(running: list[RunningJob], victim: str | None) -> None:
    for choose in (choose_victim, POLICY.choose_victim):
        got = choose(running)
        assert (got.request_id if got else None) == victim


def test_preemption_loop_frees_room_for_an_interactive_job() -> None:
    running = [job(f"b{i}", "batch", float(i), i) for i in range(8)]
    current = load(in_flight=8, batch_in_flight=8, interactive_backlog=1)
    aborted = []
    while POLICY.preemption_needed(current, "interactive", 1_000):
        victim = POLICY.choose_victim(running)
        assert victim is not None
        running.remove(victim)
        aborted.append(victim.request_id)
        current = load(in_flight=len(running), batch_in_flight=len(running), interactive_backlog=1)
    assert aborted == ["b0"]
    assert POLICY.can_start(current, 1_000, "interactive")


def test_load_from_engine_stats() -> None:
    got = EngineLoad.from_stats(
        EngineStats(running=3, waiting=1, kv_cache_usage=0.4),
        in_flight=4,
        max_num_seqs=16,
        kv_capacity_tokens=1_000,
    )
    assert got == EngineLoad(
        in_flight=4, max_num_seqs=16, kv_cache_usage=0.4, kv_capacity_tokens=1_000
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"batch_kv_watermark": 0.96},
        {"batch_kv_watermark": 0.0},
        {"interactive_kv_limit": 1.1},
        {"expected_output_fraction": 1.5},
        {"expected_output_fraction": -0.1},
    ],
)
def test_invalid_policies_are_rejected(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HeadroomPolicy(**kw)


@pytest.mark.parametrize(
    ("batch_in_flight", "can_start_batch", "batch_budget"),
    [(0, True, 2), (1, True, 1), (2, False, 0)],
)
def test_batch_cap_limits_running_batch_jobs(
    batch_in_flight: int, can_start_batch: bool, batch_budget: int
) -> None:
    policy = HeadroomPolicy(batch_max_in_flight=2)
    state = load(in_flight=batch_in_flight, batch_in_flight=batch_in_flight)
    assert policy.can_start(state, 1, "batch") is can_start_batch
    assert policy.fetch_budget(state).batch == batch_budget
    assert policy.can_start(state, 1, "interactive")  # the cap never limits interactive work


def team_load(free: int, teams: set[str], max_num_seqs: int = 8) -> EngineLoad:
    return EngineLoad(
        in_flight=max_num_seqs - free,
        max_num_seqs=max_num_seqs,
        kv_capacity_tokens=CAP,
        teams_in_flight=frozenset(teams),
    )


@pytest.mark.parametrize(
    ("free", "team", "max_num_seqs", "can"),
    [
        (2, "b", 8, True),  # more slots free than the reserve: anyone
        (1, "b", 8, False),  # the last slot is kept for a team that holds none
        (1, "a", 8, True),  # ... such as a
        (1, None, 8, True),  # no team given: no reserve
        (1, "b", 2, True),  # too few slots to keep one back
        (0, "a", 8, False),  # no slot at all
    ],
)
def test_a_slot_is_kept_for_a_team_that_holds_none(
    free: int, team: str | None, max_num_seqs: int, can: bool
) -> None:
    current = team_load(free, {"b"}, max_num_seqs)
    assert POLICY.can_start(current, 100, "interactive", team) is can


def test_preemption_for_a_newcomer_team_uses_the_reserved_slot_first() -> None:
    current = team_load(1, {"b"})
    current = EngineLoad(**{**current.__dict__, "batch_in_flight": 3})
    assert not POLICY.preemption_needed(current, "interactive", 100, "a")
    assert POLICY.preemption_needed(current, "interactive", 100, "b")


def shared_load(
    held: dict[str, int],
    weights: dict[str, float],
    free: int,
    usage: dict[str, float] | None = None,
    waiting: dict[str, float] | None = None,
) -> EngineLoad:
    return EngineLoad(
        in_flight=8 - free,
        max_num_seqs=8,
        kv_capacity_tokens=CAP,
        teams_in_flight=frozenset(held),
        team_held=held,
        active_weights=weights,
        team_usage=usage or {},
        team_waiting=waiting or {},
    )


@pytest.mark.parametrize(
    ("held", "weights", "free", "team", "slots"),
    [
        ({"b": 6}, {"b": 1.0}, 2, "b", 1),  # alone: all but the reserve
        ({"b": 4, "a": 1}, {"a": 1.0, "b": 1.0}, 3, "b", 0),  # b holds its share (7/2 -> 4)
        ({"b": 4, "a": 1}, {"a": 1.0, "b": 1.0}, 3, "a", 3),  # a (light) may take them all
        ({"b": 2, "a": 1}, {"a": 1.0, "b": 3.0}, 5, "b", 5),  # weight 3 of 4: share 6, light
        ({"b": 7, "a": 1}, {"a": 1.0, "b": 3.0}, 0, "b", 0),  # heavy (7 > 6): none free
        ({"b": 2, "a": 3}, {"a": 1.0, "b": 3.0}, 3, "a", 0),  # a above its share 2: b keeps 5
        ({"b": 7}, {"a": 1.0, "b": 1.0}, 1, "a", 1),  # a holds none: the reserved slot
    ],
)
def test_teams_share_the_slots_by_weight_while_several_are_active(
    held: dict[str, int], weights: dict[str, float], free: int, team: str, slots: int
) -> None:
    assert POLICY.slots_for(shared_load(held, weights, free), team) == slots


@pytest.mark.parametrize(
    ("held", "usage", "free", "team", "slots"),
    [
        # a steady sender (2.5 jobs on average) bursts: it may take every free slot
        ({"a": 4, "b": 3}, {"a": 2.5, "b": 4.5}, 1, "a", 1),  # the newcomers' slot too
        ({"a": 4, "b": 2}, {"a": 2.5, "b": 4.5}, 2, "a", 2),
        # the flooding team (4.5 on average, its waiting jobs included) keeps 6 slots for
        # a's bursts (2.5 + 2 * sqrt(2.5)), but never goes below half its share (4 / 2 = 2)
        ({"a": 2, "b": 1}, {"a": 2.5, "b": 4.5}, 5, "b", 1),
        ({"a": 2, "b": 2}, {"a": 2.5, "b": 4.5}, 4, "b", 0),
        ({"a": 0, "b": 2}, {"a": 2.5, "b": 4.5}, 6, "b", 0),
        # two flooding teams: each its share, the newcomers' slot kept
        ({"a": 3, "b": 3}, {"a": 4.5, "b": 4.5}, 2, "b", 1),
        ({"a": 3, "b": 4}, {"a": 4.5, "b": 4.5}, 1, "a", 0),
    ],
)
def test_a_light_team_may_burst_and_a_heavy_one_leaves_it_room(
    held: dict[str, int], usage: dict[str, float], free: int, team: str, slots: int
) -> None:
    load = shared_load(held, {"a": 1.0, "b": 1.0}, free, usage)
    assert POLICY.slots_for(load, team) == slots


@pytest.mark.parametrize(
    ("usage", "light", "cap"),
    [
        ({"a": 0.2, "b": 6.0}, {"a"}, 5),  # a barely sends: b keeps 8 - 1 - 2 slots
        ({"a": 1.0, "b": 6.0}, {"a"}, 3),  # room 1 + 3 * 1 = 4
        ({"a": 3.0, "b": 6.0}, {"a"}, 2),  # room 3 + 5.2 -> 9: b keeps half its share
        ({"a": 4.0, "b": 4.5}, set(), 4),  # neither is light: plain weighted shares
    ],
)
def test_heavy_cap_lends_room_to_light_teams_down_to_half_a_share(
    usage: dict[str, float], light: set[str], cap: int
) -> None:
    load = shared_load({"a": 1, "b": 1}, {"a": 1.0, "b": 1.0}, 6, usage)
    assert POLICY.light_teams(load) == light
    assert POLICY.heavy_cap(load, "b", frozenset(light)) == cap


@pytest.mark.parametrize(
    ("usage", "waiting", "light"),
    [
        ({"a": 2.5, "b": 2.0}, {"a": 0.05, "b": 0.9}, {"a"}),  # b always has a queue: heavy
        ({"a": 2.5, "b": 2.0}, {"a": 0.05, "b": 0.3}, {"a", "b"}),  # both steady
        ({"a": 4.5, "b": 2.0}, {"a": 0.0, "b": 0.9}, set()),  # a holds more than its share
    ],
)
def test_light_teams_hold_less_than_their_share_and_rarely_wait(
    usage: dict[str, float], waiting: dict[str, float], light: set[str]
) -> None:
    load = shared_load({"a": 2, "b": 2}, {"a": 1.0, "b": 1.0}, 4, usage, waiting)
    assert POLICY.light_teams(load) == light


def test_a_light_teams_burst_in_progress_borrows_down_to_a_heavy_teams_last_slot() -> None:
    load = shared_load({"a": 5, "b": 2}, {"a": 1.0, "b": 1.0}, 1, {"a": 2.5, "b": 2.0})
    load = EngineLoad(**{**load.__dict__, "team_waiting": {"a": 0.1, "b": 1.0}})
    assert POLICY.heavy_cap(load, "b", frozenset({"a"})) == 2  # half its share of 8 / 2
    bursting = EngineLoad(**{**load.__dict__, "team_buffered": {"a": 1, "b": 3}})
    assert POLICY.heavy_cap(bursting, "b", frozenset({"a"})) == 1
    assert POLICY.slots_for(bursting, "b") == 0 and POLICY.slots_for(bursting, "a") == 1
