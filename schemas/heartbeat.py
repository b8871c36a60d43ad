"""A worker's heartbeat: what it tells gateways and the pool controller about itself, through
a Redis key with a short TTL (`llmq:replica:<id>`), refreshed every ~0.5 s."""

from __future__ import annotations

from typing import Literal

from schemas.messages import Message

ReplicaState = Literal["loading", "ready", "draining"]


class ReplicaHeartbeat(Message):
    """A worker's liveness and load, refreshed in Redis every ~0.5 s with a short TTL."""

    type: Literal["heartbeat"] = "heartbeat"
    replica_id: str
    pool: str
    model: str
    state: ReplicaState
    healthy: bool = True
    partitions: tuple[str, ...] = ()
    kv_cache_usage: float = 0.0
    running: int = 0
    waiting: int = 0
    in_flight: int = 0
    """Jobs this worker holds (running in the engine or about to start)."""
    outstanding_tokens: int = 0
    """Prompt tokens still to prefill plus output tokens still to decode, over held jobs."""
    prefill_tokens_per_s: float = 0.0
    """Measured prefill rate (moving average); 0 until the first job finished prefill."""
    max_num_seqs: int = 0
    """Sequence slots this replica offers: its engine's max_num_seqs, or fewer while its TPOT
    cap (`LLMQ_TPOT_SLO_S`) runs fewer sequences to keep decode steps within the SLO (0: not
    reported)."""
    mean_job_s: float = 0.0
    """How long recent jobs held a slot, start to finish (mean); 0 until one finished."""
    slot_reserve: int = 0
    """Of `max_num_seqs`, the slots a team already holding a job here leaves free for teams
    holding none."""
    teams_running: tuple[str, ...] = ()
    """The teams holding jobs here (names only)."""
    startable: dict[str, int] = {}
    """The slots each team here could start a job in now, by the worker's fair-share rules
    (a flooding team is held to its share, a steady one may take the reserve); key "" for a
    team holding nothing here. Empty: not reported."""
    buffered: dict[str, int] = {}
    """Jobs fetched and waiting in this worker for a slot (not yet in the engine), by team."""
    prefill_waiting_tokens: int = 0
    """Prompt tokens still to prefill: of jobs in the engine before their first token, and of
    buffered jobs."""
    slot_free_in_s: tuple[float, ...] = ()
    """Per job in the engine, the seconds from `sent_at` until it is expected to end and free
    its slot (its expected output tokens left at the recent decode step time, plus its prefill
    if it has not started), soonest first; empty until a decode step has been timed."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters (`team/name`) its engine has loaded: routing prefers a replica that
    holds a job's adapter when it spills that adapter's requests off its home worker."""
    engine: Literal["vllm", "simulated"] = "vllm"
    """What runs the jobs; ``simulated`` is a modelled GPU replica with placeholder text."""
    sent_at: float
