"""The headroom policy: how many jobs of each priority class the worker may start now.

A worker fetches only what its engine can start, so that nothing waits on the worker that
another worker could have run. Two resources bound what can start:

- sequence slots: the jobs the worker holds (running or submitted) stay below ``max_num_seqs``
  (the engine's, or the lower cap that keeps decode steps within a TPOT SLO);
- KV cache room: a job needs its prompt plus its expected output in free KV tokens. The engine
  reports its KV use as of its last step, so jobs submitted since then (``reserved_tokens``) are
  subtracted from the room as well.

Interactive jobs may fill the KV cache up to ``interactive_kv_limit``; batch jobs start only
below ``batch_kv_watermark`` and only while no interactive job waits. When an interactive job
cannot start while batch jobs run, the caller aborts a batch victim (`choose_victim`: the one
with the least work done, so the least work is recomputed) and re-queues it.

An idle engine (nothing in flight) starts any job the class gates allow, however large: vLLM
checks ``max_model_len`` itself, and waiting for room that can never appear would stall.

Pure logic: the pull loop gathers an `EngineLoad` and asks; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from schemas.chat import Tier
from workers.engine.port import EngineStats


@dataclass(frozen=True)
class EngineLoad:
    """What the worker knows about its engine's load right now."""

    in_flight: int
    """Jobs the worker holds: running in the engine or submitted to it."""
    max_num_seqs: int
    """Sequence slots: the engine's ``max_num_seqs``, or fewer under the worker's TPOT cap
    (`LoadTracker.seq_cap`). A lowered cap may leave ``in_flight`` above it: those jobs keep
    running, and nothing starts (or is preempted to start) until they are under it again."""
    kv_cache_usage: float = 0.0
    """Fraction of the KV cache in use (0..1), from the engine's last step."""
    kv_capacity_tokens: int = 0
    """Total KV cache tokens of the engine; 0 when unknown (KV room is then not checked)."""
    reserved_tokens: int = 0
    """Prompt + expected output tokens of submitted jobs the KV usage may not reflect yet."""
    interactive_backlog: int = 0
    """Interactive jobs known to be queued in this worker's partitions or buffer."""
    batch_in_flight: int = 0
    """Batch jobs among ``in_flight``: what preemption can free."""
    teams_in_flight: frozenset[str] = frozenset()
    """Teams holding at least one job (for the slots kept for a team that holds none)."""
    team_held: Mapping[str, int] = field(default_factory=dict)
    """Jobs each team holds on this worker."""
    active_weights: Mapping[str, float] = field(default_factory=dict)
    """Weight of every team active here (holding, buffering, or seen in the last moments):
    while more than one is, each may hold only its weighted share of the slots."""
    team_usage: Mapping[str, float] = field(default_factory=dict)
    """Slots each team held on average lately (see `HeadroomPolicy.light_teams`)."""
    team_buffered: Mapping[str, int] = field(default_factory=dict)
    """Jobs of each team fetched here and not started yet."""
    team_waiting: Mapping[str, float] = field(default_factory=dict)
    """Share of time (0..1) each team had work waiting to start, lately: a flooding team's
    is near 1, a steady sender's near 0."""

    def teams_summary(self) -> dict[str, object]:
        """Free slots and each team's jobs held, average use and waiting share (for logs)."""
        return {
            "free": max(self.max_num_seqs - self.in_flight, 0),
            "held": dict(self.team_held),
            "usage": {team: round(used, 2) for team, used in self.team_usage.items()},
            "waiting": {team: round(share, 2) for team, share in self.team_waiting.items()},
        }

    @classmethod
    def from_stats(
        cls,
        stats: EngineStats,
        *,
        in_flight: int,
        max_num_seqs: int,
        kv_capacity_tokens: int = 0,
        reserved_tokens: int = 0,
        interactive_backlog: int = 0,
        batch_in_flight: int = 0,
        teams_in_flight: frozenset[str] = frozenset(),
        team_held: Mapping[str, int] | None = None,
        active_weights: Mapping[str, float] | None = None,
        team_usage: Mapping[str, float] | None = None,
        team_buffered: Mapping[str, int] | None = None,
        team_waiting: Mapping[str, float] | None = None,
    ) -> EngineLoad:
        """Build a load from the engine's own statistics plus what the worker tracks."""
        return cls(
            in_flight=in_flight,
            max_num_seqs=max_num_seqs,
            kv_cache_usage=stats.kv_cache_usage,
            kv_capacity_tokens=kv_capacity_tokens,
            reserved_tokens=reserved_tokens,
            interactive_backlog=interactive_backlog,
            batch_in_flight=batch_in_flight,
            teams_in_flight=teams_in_flight,
            team_held=team_held or {},
            active_weights=active_weights or {},
            team_usage=team_usage or {},
            team_buffered=team_buffered or {},
            team_waiting=team_waiting or {},
        )


@dataclass(frozen=True)
class FetchBudget:
    """How many records of each class the pull loop may fetch now.

    Both counts draw on the same free slots, so they do not add up: one fetch takes at most
    `total` records, at most ``batch`` of them batch (``batch <= interactive`` always holds,
    as batch room is a subset of interactive room). A class with 0 should be paused.
    """

    interactive: int
    batch: int

    @property
    def total(self) -> int:
        return max(self.interactive, self.batch)


@dataclass(frozen=True)
class RunningJob:
    """A job the worker holds, as preemption sees it."""

    request_id: str
    tier: Tier
    started_at: float
    """Monotonic time the worker started it."""
    tokens_done: int
    """Output tokens produced so far: the work an abort throws away."""


def choose_victim(running: Sequence[RunningJob]) -> RunningJob | None:
    """The batch job to abort for an interactive one: least work done, then latest started.

    Never an interactive job; None when no batch job runs.
    """
    batch = [job for job in running if job.tier == "batch"]
    if not batch:
        return None
    return min(batch, key=lambda job: (job.tokens_done, -job.started_at))


@dataclass(frozen=True)
class HeadroomPolicy:
    """Decides what may start (and be fetched) given the engine's load."""

    batch_kv_watermark: float = 0.70
    """Batch jobs start only while KV use is below this, leaving room for interactive bursts."""
    interactive_kv_limit: float = 0.95
    """Interactive jobs may fill the KV cache up to this (vLLM keeps a little for growth)."""
    expected_output_fraction: float = 0.5
    """Share of ``max_tokens`` a job is expected to produce (see `job_tokens`)."""
    batch_max_in_flight: int | None = None
    """Most batch jobs running at once (None: as many as slots allow). On a GPU, decode is
    memory-bound and extra sequences cost interactive ones little; on a CPU every sequence
    lengthens every step, so a small cap keeps interactive TPOT while batch still drains."""
    team_slot_reserve: int = 1
    """Sequence slots kept free for a team that holds no job on this worker: a team already
    running here starts another job only while more slots than this are free, so another
    team's first request never waits for a flooding team's jobs to end. Applies only when
    ``max_num_seqs`` is above twice the reserve."""
    light_share_fraction: float = 1.0
    """A light team holds on average fewer slots than this fraction of its weighted share
    (see `light_teams`); it may burst past its share while heavy teams leave it room
    (`burst_room`)."""
    light_waiting_share: float = 0.5
    """... and had work waiting less than this share of the time."""
    light_burst_sigmas: float = 3.0
    """How far above its average demand a light team's room reaches, in standard deviations
    of a Poisson count (3: its requests find a slot some 99.5% of the time; 2, some 97%,
    which spends most of a p95 TTFT's 5% on slot waits alone)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.batch_kv_watermark <= self.interactive_kv_limit <= 1.0:
            raise ValueError("need 0 < batch_kv_watermark <= interactive_kv_limit <= 1")
        if not 0.0 <= self.expected_output_fraction <= 1.0:
            raise ValueError("expected_output_fraction must be within 0..1")

    def job_tokens(self, prompt_tokens: int, max_tokens: int) -> int:
        """KV tokens to reserve for a job: its prompt plus its expected (not maximum) output.

        Most requests stop well before ``max_tokens`` (callers set it as a ceiling), so
        reserving the full ceiling would leave much of the KV cache idle. Reserving a fraction
        over-commits a little; the engine absorbs the overshoot by preempting its own
        lowest-priority sequences, which are batch ones.
        """
        if prompt_tokens < 0 or max_tokens < 0:
            raise ValueError("token counts cannot be negative")
        return prompt_tokens + math.ceil(self.expected_output_fraction * max_tokens)

    @staticmethod
    def free_slots(load: EngineLoad) -> int:
        """Sequence slots left: ``max_num_seqs - in_flight``, never below 0."""
        return max(load.max_num_seqs - load.in_flight, 0)

    def kv_limit(self, tier: Tier) -> float:
        """The KV use a job of this class may fill the cache up to."""
        return self.interactive_kv_limit if tier == "interactive" else self.batch_kv_watermark

    def free_kv_tokens(self, load: EngineLoad, tier: Tier) -> int | None:
        """KV tokens a job of this class may still take (may be negative); None if unknown."""
        if load.kv_capacity_tokens <= 0:
            return None
        room = (self.kv_limit(tier) - load.kv_cache_usage) * load.kv_capacity_tokens
        return round(room) - load.reserved_tokens  # round, not floor: 0.7 - 0.2 < 0.5

    def team_share(self, load: EngineLoad, team: str) -> int:
        """``team``'s weighted share of the slots (outside the reserve), at least one: what
        each active team may hold while none is light (see `heavy_cap`)."""
        weights = load.active_weights
        total = sum(weights.values())
        if team not in weights or len(weights) < 2 or total <= 0:
            return load.max_num_seqs
        usable = load.max_num_seqs - self._reserve(load)
        return max(1, math.ceil(usable * weights[team] / total - 1e-9))

    def slots_for(self, load: EngineLoad, team: str | None) -> int:
        """Free slots a job of ``team`` may take.

        - A team holding no job here (or no team given): all of them, the reserve included,
          so a team's first request never waits for another team's jobs to end.
        - Otherwise, while other teams are active: a *light* team (`light_teams`) may take
          every free slot, bursting past its share; a *heavy* one may hold no more than
          `heavy_cap` and leaves the reserve free. A flooding team therefore cannot fill the
          slots a steady sender's next requests need.
        - Alone: all but the reserve.
        """
        free = self.free_slots(load)
        if team is None or team not in load.teams_in_flight:
            return free
        reserve = self._reserve(load)
        if len(load.active_weights) < 2 or team not in load.active_weights:
            return max(free - reserve, 0)
        light = self.light_teams(load)
        if team in light:
            return free  # the reserve too: heavier teams already leave room for newcomers
        held = load.team_held.get(team, 0)
        return max(min(free - reserve, self.heavy_cap(load, team, light) - held), 0)

    def light_teams(self, load: EngineLoad) -> frozenset[str]:
        """Active teams that are steady senders: on average they held fewer slots than their
        weighted share (times ``light_share_fraction``) and rarely had work waiting (less
        than ``light_waiting_share`` of the time). A flooding team always has a queue,
        however few slots it is left; a steady sender's bursts are short."""
        weights = load.active_weights
        total = sum(weights.values())
        if total <= 0:
            return frozenset()

        def held(name: str) -> float:
            return load.team_usage.get(name, float(load.team_held.get(name, 0)))

        return frozenset(
            name
            for name, weight in weights.items()
            if held(name) < self.light_share_fraction * load.max_num_seqs * weight / total
            and load.team_waiting.get(name, 0.0) < self.light_waiting_share
        )

    def burst_room(self, load: EngineLoad, team: str) -> int:
        """Slots kept for a light team's bursts: its average usage plus
        ``light_burst_sigmas`` standard deviations of a Poisson count with that mean, so its
        requests rarely find no slot although a heavy team floods."""
        mean = load.team_usage.get(team, float(load.team_held.get(team, 0)))
        return max(1, math.ceil(mean + self.light_burst_sigmas * math.sqrt(mean) - 1e-9))

    def heavy_cap(self, load: EngineLoad, team: str, light: frozenset[str]) -> int:
        """The most slots a heavy team may hold: its weighted share (among heavy teams) of
        the slots left after the reserve and the light teams' `burst_room`, but never less
        than half its share of all slots (`team_share`), or one slot while a light team has
        a job waiting here: light teams' room is lent by heavy teams, down to their last slot
        only for a burst in progress."""
        weights = load.active_weights
        heavy_weight = sum(w for name, w in weights.items() if name not in light)
        kept = sum(self.burst_room(load, name) for name in light)
        usable = load.max_num_seqs - self._reserve(load) - kept
        cap = math.ceil(usable * weights[team] / max(heavy_weight, 1e-9) - 1e-9)
        if any(load.team_buffered.get(name, 0) > 0 for name in light):
            return max(1, cap)
        return max(1, cap, math.ceil(self.team_share(load, team) / 2 - 1e-9))

    def _reserve(self, load: EngineLoad) -> int:
        return self.slot_reserve(load.max_num_seqs)

    def slot_reserve(self, max_num_seqs: int) -> int:
        """The slots a team already holding a job here leaves free for teams holding none
        (none on a replica too small to spare them)."""
        return self.team_slot_reserve if max_num_seqs > 2 * self.team_slot_reserve else 0

    def can_start(
        self, load: EngineLoad, job_tokens: int, tier: Tier, team: str | None = None
    ) -> bool:
        """Whether a job of ``job_tokens`` (see `job_tokens`), this class and this team may
        start now (see `slots_for`)."""
        if self.slots_for(load, team) == 0:
            return False
        if tier == "batch" and not self._batch_open(load):
            return False
        if load.in_flight == 0:
            return True
        room = self.free_kv_tokens(load, tier)
        return room is None or job_tokens <= room

    def preemption_needed(
        self, load: EngineLoad, tier: Tier, job_tokens: int = 1, team: str | None = None
    ) -> bool:
        """Whether an interactive job cannot start (no slot or KV room) while batch jobs run.

        The caller then aborts `choose_victim` of its running jobs, re-queues it, updates the
        load and asks again. ``job_tokens`` defaults to the smallest job (any room at all).
        Never while more jobs run than ``max_num_seqs`` (a TPOT cap lowered under them):
        running jobs are not aborted to meet the cap."""
        if tier != "interactive" or load.batch_in_flight <= 0:
            return False
        if load.in_flight > load.max_num_seqs:
            return False  # over a lowered TPOT cap: one abort frees no slot, none is made
        return not self.can_start(load, job_tokens, "interactive", team)

    def choose_victim(self, running: Sequence[RunningJob]) -> RunningJob | None:
        """See the module-level `choose_victim`."""
        return choose_victim(running)

    def fetch_budget(self, load: EngineLoad, *, typical_job_tokens: int = 0) -> FetchBudget:
        """How many records of each class to fetch now, so that what is fetched can start.

        Interactive: the free slots while there is interactive KV room, plus one per running
        batch job (none over a lowered TPOT cap): an interactive job fetched then starts by
        preempting one. (Whether any interactive job waits cannot be known without fetching:
        a paused partition reports no new high watermark.)
        Batch: 0 while an interactive job waits or KV use is at the watermark, else the free
        slots. With ``typical_job_tokens`` > 0 (e.g. a running mean of `job_tokens`) and a
        known KV capacity, each class is also capped by how many typical jobs fit its room.
        """
        room = self._fits(load, "interactive", typical_job_tokens)
        preempt = load.batch_in_flight if load.in_flight <= load.max_num_seqs else 0
        batch = (
            min(self._fits(load, "batch", typical_job_tokens), self._batch_room(load))
            if self._batch_open(load)
            else 0
        )
        return FetchBudget(interactive=room + preempt, batch=batch)

    def _batch_open(self, load: EngineLoad) -> bool:
        return (
            load.interactive_backlog == 0
            and load.kv_cache_usage < self.batch_kv_watermark
            and self._batch_room(load) > 0
        )

    def _batch_room(self, load: EngineLoad) -> int:
        """Batch jobs that may still start under `batch_max_in_flight`."""
        if self.batch_max_in_flight is None:
            return load.max_num_seqs
        return max(self.batch_max_in_flight - load.batch_in_flight, 0)

    def _fits(self, load: EngineLoad, tier: Tier, typical_job_tokens: int) -> int:
        """How many jobs of this class fit the free slots and KV room (ignoring class gates)."""
        slots = self.free_slots(load)
        if slots == 0 or load.in_flight == 0:
            return slots
        room = self.free_kv_tokens(load, tier)
        if room is None:
            return slots
        if room <= 0:
            return 0
        if typical_job_tokens <= 0:
            return slots
        return min(slots, room // typical_job_tokens)
