"""Team activity: who shares a worker's slots, with a linger so steady senders keep a share."""

from __future__ import annotations

from workers.team_activity import TeamActivity


def test_teams_stay_active_for_the_linger_time_with_their_latest_weight() -> None:
    now = [0.0]
    teams = TeamActivity(10.0, clock=lambda: now[0])
    teams.weigh("a", 2.0)
    assert teams.active(["a"], ["b"]) == {"a": 2.0, "b": 1.0}
    now[0] = 9.0
    assert teams.active([], ["b"]) == {"a": 2.0, "b": 1.0}  # a lingers
    now[0] = 10.5
    assert teams.active([], []) == {"b": 1.0}  # a is gone (and forgets its weight)
    assert teams.active(["a"], []) == {"a": 1.0, "b": 1.0}


def test_usage_is_a_moving_average_of_slots_held() -> None:
    now = [0.0]
    teams = TeamActivity(10.0, clock=lambda: now[0], usage_window_s=10.0)
    assert teams.usage({"a": 4}) == {"a": 4.0}  # first sight: what it holds
    now[0] = 10.0
    usage = teams.usage({"a": 0, "b": 2})
    assert 1.4 < usage["a"] < 1.5  # 4 * e^-1: a decays towards 0
    assert usage["b"] == 2.0
    now[0] = 100.0
    assert "a" not in teams.usage({"b": 2})  # long idle: forgotten
