"""The engine's load as the headroom policy sees it, from what the pull loop holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from schemas.messages import InferenceJob
from workers.engine.port import EngineClient
from workers.headroom import EngineLoad, HeadroomPolicy
from workers.load import LoadTracker
from workers.team_activity import TeamActivity


def engine_load(
    engine: EngineClient,
    policy: HeadroomPolicy,
    tracker: LoadTracker,
    teams: TeamActivity,
    *,
    running: Sequence[InferenceJob],
    waiting: Sequence[InferenceJob],
    interactive_buffered: int,
) -> EngineLoad:
    """`running`: the jobs holding a slot (started, the engine not done with them);
    `waiting`: the jobs fetched and held, not started; `interactive_buffered`: how many of
    those are interactive."""
    held = Counter(job.team for job in running)
    not_started = tracker.not_started()
    reserved = sum(
        policy.job_tokens(len(job.prompt_token_ids), job.sampling.max_tokens)
        for job in running
        if job.request_id in not_started
    )
    waiting_teams = [job.team for job in waiting]
    behaviour = teams.behaviour(held, waiting_teams)
    stats = engine.stats()
    return EngineLoad.from_stats(
        stats,
        in_flight=len(running),
        # Fewer slots while the TPOT cap says more sequences would slow every step past the
        # SLO; jobs already running over a lowered cap keep running (see preemption_needed).
        max_num_seqs=tracker.seq_cap(engine.max_num_seqs, stats.prefill_tokens_per_s),
        kv_capacity_tokens=engine.kv_capacity_tokens,
        reserved_tokens=reserved,
        # Interactive partitions are fetched whenever a fetched job could start (a free
        # slot, or a batch job to preempt), so waiting interactive work reaches the buffer
        # promptly; high watermarks of paused partitions would be stale anyway.
        interactive_backlog=interactive_buffered,
        # Every held batch job, started in the runner or not yet (a job's task reaches the
        # engine only after a few Redis round trips): counting only running ones let one
        # fetch start a burst of batch jobs past the cap.
        batch_in_flight=sum(1 for job in running if job.tier == "batch"),
        teams_in_flight=frozenset(held),
        team_held=held,
        active_weights=behaviour.weights,
        team_usage=behaviour.usage,
        team_buffered=Counter(waiting_teams),
        team_waiting=behaviour.waiting,
    )
