"""A request's wait on the replica it is routed to, slot by slot: the per-worker half of
admission's TTFT prediction.

A worker's heartbeat says, per job in its engine, when that job is expected to end and free
its slot (`slot_free_in_s`, counted from the heartbeat's `sent_at`), how many jobs wait in
the worker for a slot (`buffered`) and the prompt tokens still to prefill. The gateway adds
the jobs it has itself sent to that replica since that heartbeat (`ReplicaSends`), counts
those the worker starts first (`jobs_ahead`: fair order between teams), then plays the slots
forward: each job ahead takes the soonest free slot and holds it for the replica's mean job
time, and the request starts in the next slot to free. When the heartbeat says the team may
start more jobs now than it has waiting (`startable`, the worker's fair-share rules: a steady
team may take the slots a flooding one must leave free), there is no slot wait at all. Its
wait is that start plus the prefill of the prompts ahead of it at the replica's rate.

What it cannot see: jobs other gateways sent since the heartbeat (the next heartbeat, within
a fifth of a second, shows them), team weights, and a heavy team's cap on its own slots.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from schemas.heartbeat import ReplicaHeartbeat

KEPT_S = 30.0
"""How long a send is remembered (far longer than heartbeats take to show it)."""


@dataclass(frozen=True)
class RecentSends:
    """Jobs this gateway sent to one replica since a moment: by team, and their prompts."""

    teams: dict[str, int] = field(default_factory=dict)
    """Those not yet started, by team."""
    prompt_tokens: int = 0
    started: int = 0
    """Those started since: not waiting, but holding a slot the heartbeat shows free."""


class ReplicaSends:
    """The interactive jobs this gateway sent to each replica, by time: what that replica's
    last heartbeat cannot show yet."""

    def __init__(self) -> None:
        self._sends: dict[str, deque[tuple[float, str, int, str]]] = {}
        self._started: set[str] = set()
        """Requests sent and since started (their first token came back): not waiting."""

    def record(
        self, replica_id: str, at: float, team: str, prompt_tokens: int, request_id: str = ""
    ) -> None:
        sends = self._sends.setdefault(replica_id, deque())
        sends.append((at, team, prompt_tokens, request_id))
        while sends and sends[0][0] < at - KEPT_S:
            self._started.discard(sends.popleft()[3])

    def started(self, request_id: str) -> None:
        """A sent request has started (or ended): it waits no more, heartbeat or not."""
        self._started.add(request_id)

    def withdrawn(self, request_id: str) -> None:
        """A recorded job will not be produced after all (the quota refused it, the broker
        failed): forget it, so it neither waits nor holds a slot."""
        self._started.discard(request_id)
        for sends in self._sends.values():
            for entry in sends:
                if entry[3] == request_id:
                    sends.remove(entry)
                    return

    def since(self, replica_id: str, at: float) -> RecentSends:
        """What was sent to the replica after `at` (its heartbeat's `sent_at`) and has not
        started since."""
        teams: dict[str, int] = {}
        tokens = started = 0
        for sent_at, team, prompt_tokens, request_id in reversed(self._sends.get(replica_id, ())):
            if sent_at <= at:
                break
            if request_id in self._started:
                started += 1
                continue
            teams[team] = teams.get(team, 0) + 1
            tokens += prompt_tokens
        return RecentSends(teams, tokens, started)


def jobs_ahead(waiting: dict[str, int], team: str) -> int:
    """Jobs a worker starts before a new one of `team`, of those waiting by team: the team's
    own, and of each other team's at most as many as the team will then have waiting (workers
    start teams' jobs in weighted fair order; equal weights assumed, as the pool's backlog
    does)."""
    mine = waiting.get(team, 0)
    return mine + sum(min(n, mine + 1) for other, n in waiting.items() if other != team)


def slot_wait_s(
    replica: ReplicaHeartbeat, *, now: float, jobs_ahead: int, team: str = ""
) -> float | None:
    """Seconds until a slot is free for a job of `team` with `jobs_ahead` jobs before it on
    `replica`, each holding a slot for the replica's mean job time; None when the heartbeat
    does not say (no slots reported, or jobs running whose ends are not timed yet). A team
    alone on the replica leaves its reserve free for newcomers (with other teams there, a
    steady sender may take it)."""
    slots = replica.max_num_seqs
    if replica.teams_running == (team,):
        slots -= replica.slot_reserve
    ends = replica.slot_free_in_s
    if slots <= 0 or (replica.in_flight > 0 and not ends):
        return None
    elapsed = min(max(now - replica.sent_at, 0.0), 60.0)
    free_at = [max(end - elapsed, 0.0) for end in ends]
    # Slots nobody holds are free now; sequences beyond the slots (a lowered TPOT cap) must
    # end before anything starts, and free nothing usable.
    heap = [0.0] * max(slots - len(free_at), 0) + free_at
    heapq.heapify(heap)
    for _ in range(max(len(free_at) - slots, 0)):
        heapq.heappop(heap)
    hold_s = replica.mean_job_s
    for _ in range(jobs_ahead):
        heapq.heappush(heap, heapq.heappop(heap) + hold_s)
    return heap[0]


@dataclass(frozen=True)
class ReplicaWait:
    """What is ahead of a request on a replica, in raw seconds."""

    slot_s: float
    """Until a slot is free for it."""
    prefill_ahead_s: float
    """The prefill of prompts ahead of it, at the replica's rate."""
    team_waiting: int = 0
    """Jobs of its own team waiting there for a slot (0: it is its team's first)."""
    running: int = 0
    """Sequences running there as it arrives (whose decode steps its prefill shares)."""


def replica_wait(
    replica: ReplicaHeartbeat,
    *,
    now: float,
    sent: RecentSends,
    prefill_tokens_per_s: float,
    team: str = "",
) -> ReplicaWait | None:
    """The raw waits before a request's own prefill on `replica` (None: see `slot_wait_s`)."""
    waiting = dict(replica.buffered)
    for other, jobs in sent.teams.items():
        waiting[other] = waiting.get(other, 0) + jobs
    startable = replica.startable.get(team, replica.startable.get(""))
    if startable is not None and waiting.get(team, 0) + sent.started < startable:
        slot_s: float | None = 0.0  # the worker starts it at once, whoever else waits
    else:
        ahead = jobs_ahead(waiting, team) + sent.started
        slot_s = slot_wait_s(replica, now=now, jobs_ahead=ahead, team=team)
    if slot_s is None:
        return None
    ahead_tokens = replica.prefill_waiting_tokens + sent.prompt_tokens
    running = replica.in_flight + sent.started
    return ReplicaWait(slot_s, ahead_tokens / prefill_tokens_per_s, waiting.get(team, 0), running)
