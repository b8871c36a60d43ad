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
