"""Ports: what the gateway and workers need from the message plane, as protocols.

Adapters (`topics.kafka`, `topics.redis_relay`) implement them; services depend only on these.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from schemas.adapters import AdapterRecord
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import (
    BatchResultEvent,
    CancelEvent,
    DeadLetter,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
    UsageCounts,
    UsageRecord,
)
from schemas.registry import DeploymentRecord
from schemas.rollout import ArmSample
from topics.catalog import PriorityClass

ReplyEventT = TokenEvent | FinishEvent | ErrorEvent


@dataclass(frozen=True)
class JobReceipt:
    """Where a produced job landed."""

    topic: str
    partition: int
    offset: int


class JobQueue(Protocol):
    """Producer side of the job topics."""

    async def submit(self, job: InferenceJob, *, partition: int | None = None) -> JobReceipt:
        """Produce a job durably (acks=all) and return where it landed."""
        ...

    async def partitions(self, pool: str, tier: PriorityClass) -> int:
        """How many partitions the pool's job topic for this class has."""
        ...


class JobWake(Protocol):
    """Tells a pool's idle workers that a job was queued, so that they fetch now instead of
    polling the broker while idle. Kafka still holds every job: a lost wake-up costs the
    job latency (a worker's idle interval), never the job."""

    async def announce(self, pool: str) -> None: ...


class ReplySubscription(Protocol):
    """The events of one request, in order, as they reach this gateway."""

    request_id: str
    interrupted: bool
    """The relay was cut while the request was open: its job may still be running."""

    def __aiter__(self) -> AsyncIterator[ReplyEventT]: ...

    async def next_event(self) -> ReplyEventT:
        """The next event (bound the wait with `end_at`)."""
        ...

    def end_at(self, deadline: float, event: ReplyEventT) -> None:
        """Deliver `event` at `deadline` (Unix time) unless the request is closed first."""


class ReplyRelay(Protocol):
    """Gateway side of the token relay: one shared subscription, demultiplexed per request."""

    channel: str
    connected: bool
    """Whether the subscription is live (events published now will arrive)."""

    def open(self, request_id: str) -> ReplySubscription:
        """Start collecting a request's events; call before the job is produced."""
        ...

    def close(self, request_id: str) -> None:
        """Stop collecting a request's events."""


class Delivered(NamedTuple):
    """A streamed job's usage to record as delivered if its token event reaches a gateway:
    the attempt hash (`JobAttempts`) then holds exactly what its caller has seen."""

    attempt_key: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class EventPublisher(Protocol):
    """Worker side of the token relay. Events reach the relay in the order they are handed
    over, whether by `publish` or by `push`."""

    async def publish(self, channel: str, event: ReplyEventT) -> int:
        """Publish one event; return how many gateways received it (0: nobody listens)."""
        ...

    def push(
        self, channel: str, payload: bytes, delivered: Delivered | None = None
    ) -> asyncio.Future[dict[str, int]]:
        """Hand over one token event's JSON without waiting (the per-token path); with
        `delivered`, record that usage if a gateway receives it, atomically with the publish.
        The future resolves to the subscribers reached per channel of the message that
        carried it (0: nobody listens), or to the publish's exception."""
        ...


class DeadLetterSink(Protocol):
    """The dead-letter topic: records that cannot be processed, with the reason."""

    async def publish(self, letter: DeadLetter) -> None: ...


class ResultSink(Protocol):
    """Where batch lines' outcomes go (the durable results topic)."""

    async def publish(self, event: BatchResultEvent) -> None: ...


class BatchCancellations(Protocol):
    """Whether a batch was cancelled (its queued lines are then dropped, not run)."""

    async def is_batch_cancelled(self, batch_id: str) -> bool: ...


class CancelBus(Protocol):
    """Cancellation of running and still-queued requests."""

    async def cancel(self, event: CancelEvent) -> None: ...

    async def is_cancelled(self, request_id: str) -> bool: ...


class JobLedger(Protocol):
    """Which requests already reached a terminal event (consumers are idempotent by id)."""

    async def is_finished(self, request_id: str) -> bool: ...

    async def mark_finished(self, request_id: str) -> bool:
        """Remember the request as finished; False if another run already did (that run
        billed it, so this one must not write a second usage record)."""
        ...


@dataclass(frozen=True)
class AttemptRecord:
    """What earlier runs of one job left behind, read as a new run begins."""

    attempt: int
    """This run's number (1: the first)."""
    failed: int
    """Earlier runs that ended without an outcome: their worker died, or the engine raised."""
    delivered: UsageCounts
    """What earlier runs streamed to the caller (completion tokens the caller has seen)."""


@dataclass(frozen=True)
class StartChecks:
    """What a worker learns as a job leaves the queue, before its engine sees it."""

    finished: bool
    """An earlier run already reached a terminal event (`JobLedger`)."""
    cancelled: bool
    """Its caller cancelled it while it was queued (`CancelBus`)."""
    earlier: AttemptRecord
    """This run, counted, and what earlier runs left (`JobAttempts.begin`)."""


class JobStart(Protocol):
    """A job leaves the queue: take its prompt off the pool's backlog (`QueueBacklog`), count
    its run, and read whether it is finished or cancelled; all before the engine, so as
    one round trip where the store allows it."""

    async def begin(self, job: InferenceJob, attempt_key: str) -> StartChecks: ...


class JobAttempts(Protocol):
    """Runs of each job, so a redelivered job knows whether its caller already saw tokens
    (it must not be re-run silently) and whether it keeps killing workers (dead-letter it)."""

    async def begin(self, key: str) -> AttemptRecord:
        """Count a new run of the job and return what earlier runs left."""
        ...

    async def ended(self, key: str) -> None:
        """The run ended in a handled way (an outcome, a preemption, a shutdown)."""
        ...


@dataclass(frozen=True)
class BacklogAdmission:
    """The outcome of one atomic check-and-queue against a pool's backlog."""

    added: bool
    queued: int
    """The pool's queued prompt tokens before this request."""
    team_queued: int = 0
    """The request's team's share of them."""
    ahead: int = 0
    """Queued tokens served before this request under fair queuing between teams: the team's
    own queue plus, of every other team's, at most as much as this team will then have queued."""


class QueueBacklog(Protocol):
    """Prompt tokens queued per pool and priority class (and team), for admission."""

    async def add(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        """Count `prompt_tokens` backlog units; `waiting_tokens` of them (default: all) are
        a prompt waiting to start (`team_queued`)."""

    async def try_add(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        limit: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> BacklogAdmission:
        """Queue the tokens atomically if what is served before them under fair queuing
        between teams (`BacklogAdmission.ahead`) plus themselves stays within `limit`; a team
        with nothing queued is always admitted."""
        ...

    async def remove(
        self,
        pool: str,
        tier: PriorityClass,
        prompt_tokens: int,
        team: str | None = None,
        waiting_tokens: int | None = None,
    ) -> None:
        """Uncount backlog units; `waiting_tokens` of them (default: all) stop waiting."""

    async def free_slot(
        self,
        pool: str,
        tier: PriorityClass,
        slot_units: int,
        team: str,
        request_id: str,
        replay_id: str | None = None,
    ) -> bool:
        """Uncount a job's slot share (`InferenceJob.slot_units`) once (per replay) however
        many of its runs and ends reach it; False when it already was."""
        ...

    async def queued(self, pool: str, tier: PriorityClass) -> int: ...

    async def team_queued(self, pool: str, tier: PriorityClass) -> dict[str, int]:
        """Prompt tokens waiting to start per team (teams with none are absent)."""
        ...


BucketOutcome = Literal["ok", "insufficient_tokens", "exceeds_capacity", "unchecked"]
"""``exceeds_capacity``: larger than one minute's quota, never satisfiable; ``unchecked``: the
bucket store was unreachable and the request was let through (fail open)."""


@dataclass(frozen=True)
class BucketDecision:
    """The outcome of one reservation against a team's bucket."""

    allowed: bool
    remaining: int
    """Whole tokens left in the bucket after this decision."""
    retry_after_s: int
    """Seconds until the bucket holds enough (0 when allowed or never satisfiable)."""
    outcome: BucketOutcome = "ok"

    @property
    def satisfiable(self) -> bool:
        """False when the request exceeds the bucket's capacity: waiting will not help."""
        return self.outcome != "exceeds_capacity"


class TokenBucket(Protocol):
    """Per-team token buckets: capacity = tokens_per_minute, refilled continuously."""

    async def reserve(self, team: str, tokens: int, tokens_per_minute: int) -> BucketDecision:
        """Take `tokens` atomically if the bucket holds them; otherwise take nothing."""
        ...

    async def refund(self, team: str, tokens: int, tokens_per_minute: int) -> None:
        """Give back `tokens` (the bucket never exceeds its capacity)."""
        ...


class ReplicaDirectory(Protocol):
    """Live replicas, from their heartbeats."""

    async def replicas(self) -> list[ReplicaHeartbeat]: ...


class AdapterDemand(Protocol):
    """Each LoRA adapter's outstanding jobs in a pool, counted across gateways: what routing
    spreads a busy adapter by."""

    async def started(self, pool: str, adapter: str, request_id: str, deadline: float) -> int:
        """Count one job until it ends (or its deadline passes); return the adapter's
        outstanding jobs, this one included."""
        ...

    async def ended(self, pool: str, adapter: str, request_id: str) -> None:
        """Stop counting a job (idempotent)."""


class UsageSink(Protocol):
    async def record(self, usage: UsageRecord) -> None: ...


@dataclass(frozen=True)
class RegistryEntry:
    """One record of the registry log: a deployment's or an adapter's state, or its deletion
    (None); `name` is the record's key."""

    offset: int
    name: str
    record: DeploymentRecord | AdapterRecord | None


class RegistryLog(Protocol):
    """The registry topic: read from its start and followed live; written by admins."""

    async def publish(self, name: str, record: DeploymentRecord | AdapterRecord | None) -> int:
        """Append `record` (None: delete `name`); return its offset once the log has it."""
        ...

    async def end_offset(self) -> int:
        """The offset the next record will take (what a reader has seen all of, once past)."""
        ...

    def entries(self) -> AsyncIterator[RegistryEntry]:
        """Every entry from the log's start, then new ones as they arrive, until stopped."""
        ...


class ArmStats(Protocol):
    """Finished requests per deployment version (`name@version`) in rollout, recent ones
    only: what the rollout controller compares a canary's arm with the stable one's on."""

    async def record(self, ref: str, sample: ArmSample) -> None: ...

    async def since(self, ref: str, since: float) -> list[ArmSample]:
        """The samples of `ref` that finished at or after `since` (unix seconds)."""
        ...


class TopicWatch(Protocol):
    """What operators see of the topics: consumer lag and the newest records."""

    async def lag(self, group: str, topics: Sequence[str]) -> dict[str, int]:
        """Per topic that exists: records `group` has not committed (waiting or running)."""
        ...

    async def tail(self, topic: str, last: int) -> tuple[int, list[bytes]]:
        """(records the topic holds, the values of its newest `last`, newest last)."""
        ...
