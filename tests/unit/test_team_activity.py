"""Team activity: who shares a worker's slots, with a linger so steady senders keep a share."""

from __future__ import annotations

import asyncio
from collections import Counter

from workers.headroom import EngineLoad, HeadroomPolicy
from workers.team_activity import TeamActivity, watch_team_queues


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
    assert teams.observe({"a": 4}, {})[0] == {"a": 4.0}  # first sight: what it holds
    now[0] = 10.0
    usage, _ = teams.observe({"a": 0, "b": 2}, {})
    assert 1.4 < usage["a"] < 1.5  # 4 * e^-1: a decays towards 0
    assert usage["b"] == 2.0
    now[0] = 100.0
    assert "a" not in teams.observe({"b": 2}, {})[0]  # long idle: forgotten


def test_waiting_is_the_share_of_time_with_a_job_waiting_and_newcomers_start_waiting() -> None:
    now = [0.0]
    teams = TeamActivity(10.0, clock=lambda: now[0], usage_window_s=30.0)
    _, waiting = teams.observe({"a": 2}, {"a": 0.2})
    assert waiting == {"a": 1.0}  # a newcomer counts as always waiting
    now[0] = 30.0  # a window later: it never waited, so its share decays towards 0
    _, waiting = teams.observe({"a": 2, "b": 1}, {"a": 0.2, "b": 2.0})
    assert 0.36 < waiting["a"] < 0.37  # e^-1
    assert waiting["b"] == 1.0  # b is new, and waiting
    now[0] = 60.0
    _, waiting = teams.observe({"a": 2, "b": 1}, {"b": 2.0})
    assert waiting["a"] < 0.15 and waiting["b"] == 1.0  # a steady sender, a flooding team


def test_a_team_gone_past_the_linger_time_comes_back_as_a_newcomer() -> None:
    """A flooding team that paused must not come back with its decayed averages (which
    would pass it for a light sender until they caught up)."""
    now = [0.0]
    teams = TeamActivity(10.0, clock=lambda: now[0], usage_window_s=30.0)
    teams.note_prompt("b", 100)
    for step in range(1, 31):  # b floods for 30 s: always a job buffered
        now[0] = float(step)
        assert teams.behaviour({"b": 8}, ["b"]).waiting["b"] > 0.99
    now[0] = 35.0
    assert teams.behaviour({}, []).waiting["b"] < 0.9  # idle, lingering: decaying
    now[0] = 95.0  # a minute idle, then it floods again
    behaviour = teams.behaviour({"b": 1}, ["b"])
    assert behaviour.waiting["b"] == 1.0 and behaviour.usage["b"] == 1.0


def test_waiting_jobs_count_the_pools_queue_in_prompts_when_it_exceeds_the_buffer() -> None:
    teams = TeamActivity(10.0)
    teams.note_prompt("a", 1_000)
    teams.note_prompt("b", 500)
    teams.note_queued({"b": 3_000, "c": 9_000})  # c: never seen here, left out
    assert teams.waiting_jobs(["a", "b"]) == {"a": 1.0, "b": 6.0}
    teams.note_started("b", 2_500)  # started here: off the queue before the next read
    assert teams.waiting_jobs([]) == {"b": 1.0}
    teams.note_started("b", 800)
    assert teams.waiting_jobs([]) == {}
    teams.note_queued({})
    assert teams.waiting_jobs(["b", "b"]) == {"b": 2.0}


def test_behaviour_reports_weights_usage_and_waiting_of_the_active_teams() -> None:
    teams = TeamActivity(10.0)
    teams.weigh("a", 2.0)
    teams.note_prompt("a", 100)
    behaviour = teams.behaviour({"a": 1}, ["a"])
    assert behaviour.weights == {"a": 2.0}
    assert behaviour.usage == {"a": 1.0} and behaviour.waiting == {"a": 1.0}


async def test_the_queue_watch_keeps_the_latest_queue_and_forgets_it_on_failure() -> None:
    class Backlog:
        """Answers call n only once the test releases it; each call's start is an event, so
        the test knows the previous answer has been noted."""

        def __init__(self) -> None:
            self.answers: list[dict[str, int] | Exception] = [{"b": 2_000}, OSError("down")]
            self.started = [asyncio.Event() for _ in range(3)]
            self.release = [asyncio.Event() for _ in range(3)]
            self.calls = 0

        async def team_queued(self, pool: str, tier: str) -> dict[str, int]:
            assert (pool, tier) == ("p", "interactive")
            n, self.calls = self.calls, self.calls + 1
            self.started[n].set()
            await self.release[n].wait()
            answer = self.answers[n]
            if isinstance(answer, Exception):
                raise answer
            return answer

    teams = TeamActivity(10.0)
    teams.note_prompt("b", 1_000)
    backlog = Backlog()
    watch = asyncio.create_task(watch_team_queues(backlog, "p", teams, interval_s=0))  # type: ignore[arg-type]
    try:
        backlog.release[0].set()
        await backlog.started[1].wait()
        assert teams.waiting_jobs([]) == {"b": 2.0}
        backlog.release[1].set()
        await backlog.started[2].wait()
        assert teams.waiting_jobs([]) == {}  # the failed read forgot the queue
    finally:
        watch.cancel()


def test_a_flooding_team_is_never_light_from_its_first_job_nor_when_it_comes_back() -> None:
    """The headroom policy's view, second by second: a steady team holds 1-2 of 16 slots and
    rarely waits; a flood arrives (always a job waiting), stops for a minute, and comes back.
    The flood never passes for a light sender, so it never takes the slots kept for the
    steady team's bursts (it did for 10-20 s into each flood, taking all 16)."""
    now = [0.0]
    teams = TeamActivity(10.0, clock=lambda: now[0], usage_window_s=30.0)
    policy = HeadroomPolicy()
    teams.note_prompt("a", 100)
    teams.note_prompt("b", 100)

    def view(held: dict[str, int], buffered: list[str]) -> tuple[frozenset[str], int, int]:
        """Light teams, the slots b may take, and the slots a's bursts are owed."""
        behaviour = teams.behaviour(held, buffered)
        load = EngineLoad(
            in_flight=sum(held.values()), max_num_seqs=16, teams_in_flight=frozenset(held),
            team_held=held, active_weights=behaviour.weights, team_usage=behaviour.usage,
            team_buffered=Counter(buffered), team_waiting=behaviour.waiting,
        )  # fmt: skip
        owed = policy.slot_reserve(16) + policy.burst_room(load, "a")
        return policy.light_teams(load), policy.slots_for(load, "b"), owed

    for second in range(60):  # the steady team alone: it earns its light status
        now[0] = float(second)
        view({"a": 1 + second % 2}, [])
    for start in (60, 150):  # a flood, then the same flood after a minute's pause
        for second in range(start, start + 30):
            now[0] = float(second)
            held_b = min(8, 1 + second - start)  # its jobs start one a second, up to 8
            queue = ["b"] if second > start else []  # its first job found a slot at once
            light, room, owed = view({"a": 1 + second % 2, "b": held_b}, queue)
            assert "b" not in light and "a" in light, second
            assert held_b + room <= 16 - owed, second  # b leaves a's burst room and reserve
        for second in range(start + 30, start + 90):  # b stops; a goes on
            now[0] = float(second)
            view({"a": 1 + second % 2}, [])
