"""The worker's pull loop: fetch only what the engine can start, commit only what is done.

Each turn of the loop:
1. starts buffered jobs in weighted fair order between teams, interactive before batch, while
   the headroom policy allows; an interactive job that cannot start while batch jobs run
   preempts the batch job with the least work done (it is re-queued to its topic, so its
   caller never sees the restart);
2. fetches at most what the headroom budget allows per class, pausing the partitions of a
   class that may not fetch (batch pauses while interactive work waits in this worker's
   partitions or the KV cache is above the batch watermark);
3. commits, per partition, up to the lowest job that has not reached a terminal event
   (`workers.offsets`): a crash re-delivers exactly the unfinished and unstarted jobs. How
   each run settles its offset is `workers.running_jobs`.

`stop()` drains: no more fetching or starting, running jobs finish (up to a grace period),
offsets are committed; jobs still buffered stay uncommitted for the partition's next owner.

This loop uses aiokafka's consumer directly, not FastStream like the other services that
consume topics (`topics.kafka_streams`): it fetches only as much as the engine's KV headroom
allows, pauses and resumes partitions per class, and commits each partition below its lowest
unfinished job while later ones still run. A subscriber that is handed one record at a time
and commits in order can express none of that.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from schemas.messages import InferenceJob
from topics import catalog
from topics.ports import DeadLetterSink, JobQueue
from workers.caught_up import CaughtUp
from workers.commits import CommitOnRevoke, commit_done
from workers.dead_letters import set_aside
from workers.engine.port import EngineClient
from workers.fair_queue import FairQueue
from workers.fetch_plan import plan_fetch, wake_during
from workers.headroom import EngineLoad, HeadroomPolicy
from workers.load import LoadTracker
from workers.load_view import engine_load
from workers.offsets import OffsetTracker
from workers.runner import JobRunner
from workers.running_jobs import Fetched, RunningJobs
from workers.team_activity import TEAM_ACTIVE_S, TeamActivity

log = structlog.get_logger()

PRIORITY = {"interactive": 0, "batch": 10}
IDLE_WAIT_S = 0.05
"""How long a turn waits for a slot to free when nothing can be fetched or started."""
SETTLE_FETCH_ROUNDS = 3
"""Fetch rounds (of `fetch_max_wait_s`) a partition must come back empty, after the last
announcement, before the worker counts it caught up (`CaughtUp`)."""


class PullLoop:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        engine: EngineClient,
        runner: JobRunner,
        pool: str,
        *,
        requeue: JobQueue,
        dead_letters: DeadLetterSink,
        load: LoadTracker,
        policy: HeadroomPolicy | None = None,
        fair_lookahead: int = 4,
        teams: TeamActivity | None = None,
        idle_fetch_interval_s: float | None = None,
        fetch_max_wait_s: float = 0.01,
    ) -> None:
        self._consumer = consumer
        self._engine = engine
        self._runner = runner
        self._pool = pool
        self._dead_letters = dead_letters
        self._requeue = requeue
        self._load = load
        self._policy = policy or HeadroomPolicy()
        self._lookahead = fair_lookahead
        self.offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self._buffer: FairQueue[Fetched] = FairQueue()
        self._next: Fetched | None = None  # popped in fair order, waiting for room
        self._running = RunningJobs(
            engine, runner, requeue=requeue, offsets=self.offsets,
            queue_again=self._enqueue, changed=self._wake_set,
        )  # fmt: skip
        self._waited: set[str] = set()
        """Buffered jobs whose wait for room was logged (once per job)."""
        self._teams = teams or TeamActivity(TEAM_ACTIVE_S)
        self._wake = asyncio.Event()
        self._announced = asyncio.Event()
        """A job was queued for this pool (`announced()`): fetch now, even when idle."""
        self._caught_up: CaughtUp[TopicPartition] = CaughtUp(
            SETTLE_FETCH_ROUNDS * fetch_max_wait_s, idle_fetch_interval_s
        )
        self._stopping = asyncio.Event()
        self._topics = {cls: catalog.job_topic(pool, cls) for cls in catalog.PRIORITY_CLASSES}

    def _wake_set(self) -> None:
        self._wake.set()

    # -- what the heartbeat and tests read -------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def buffered(self) -> int:
        return len(self._buffer) + (self._next is not None) + len(self._running.held_copies())

    def startable_by_team(self) -> dict[str, int]:
        """The slots each team here could start a job in now, by the fair-share rules
        (`HeadroomPolicy.slots_for`); key "" for a team holding nothing here."""
        load = self._engine_load()
        teams = {*load.teams_in_flight, *load.active_weights, *load.team_buffered}
        startable = {team: self._policy.slots_for(load, team) for team in sorted(teams)}
        startable[""] = self._policy.slots_for(load, None)
        return startable

    def buffered_by_team(self) -> tuple[dict[str, int], int]:
        """The buffered jobs by team, and their prompt tokens (all still to prefill)."""
        held = [*self._buffer.items(), *([self._next] if self._next else [])]
        held += self._running.held_copies()
        teams: dict[str, int] = {}
        for fetched in held:
            teams[fetched.job.team] = teams.get(fetched.job.team, 0) + 1
        return teams, sum(len(f.job.prompt_token_ids) for f in held)

    @property
    def polling(self) -> bool:
        """False while every assigned partition is paused (a worker that has fetched all there
        is, waiting for an announced job, or one with no room for any job): no fetch reaches
        the broker."""
        assignment = self._consumer.assignment()
        return not assignment or not assignment <= self._consumer.paused()

    def assigned(self) -> list[str]:
        return sorted(f"{tp.topic}:{tp.partition}" for tp in self._consumer.assignment())

    # -- control ----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def announced(self) -> None:
        """A job was queued for this pool (a `JobWake`), or the assignment changed: a quiet
        loop polls again now, until it has caught up (`CaughtUp`)."""
        self._caught_up.announced(time.monotonic())
        self._announced.set()

    async def cancel(self, request_id: str) -> bool:
        """Abort a running job at its client's request; False if it is not running here."""
        return await self._running.cancel(request_id)

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Partitions revoked: drop their buffered jobs (the next owner fetches them)."""
        dropped = self._buffer.remove(lambda f: f.tp in partitions)
        if self._next is not None and self._next.tp in partitions:
            self._next = None
        self._waited -= {f.job.request_id for f in dropped}
        released = len(dropped) + self._running.forget(partitions)
        for tp in partitions:
            self.offsets.forget(tp)
        if released:
            log.info("buffered_jobs_released", jobs=released)

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, drain_grace_s: float) -> None:
        self._consumer.subscribe(list(self._topics.values()), listener=CommitOnRevoke(self))
        while not self._stopping.is_set():
            self._wake.clear()  # what happens from here on wakes the turn's waits
            await self._start_what_fits()
            self._announced.clear()  # a job announced from here on is fetched next turn
            fetched = await self._fetch()
            if fetched and not self._stopping.is_set():
                await self._start_what_fits()  # before the commit's round trip
            elif not self._wake.is_set():
                await self._wait_idle()
            await self.commit()
        await self._drain(drain_grace_s)

    async def _wait_idle(self) -> None:
        """Nothing was fetched and nothing woke the turn: wait for a slot to free or a job to
        be announced, up to IDLE_WAIT_S, or, while caught up (every partition paused, no
        fetch reaching the broker), up to the safety poll. An empty fetch poll every few
        milliseconds costs the broker and the worker CPU that an engine on the same machine
        needs, for nothing."""
        if self._announced.is_set():
            return
        quiet_for = self._caught_up.quiet_for(time.monotonic())
        wait_s = IDLE_WAIT_S if quiet_for is None else quiet_for
        waits = [asyncio.ensure_future(e.wait()) for e in (self._wake, self._announced)]
        try:
            await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _engine_load(self) -> EngineLoad:
        running = self._running.in_engine()
        held = [*(f.job for f in self._buffer.items()), *([self._next.job] if self._next else [])]
        return engine_load(
            self._engine, self._policy, self._load, self._teams,
            running=running, waiting=held,
            interactive_buffered=self._buffer.count(PRIORITY["interactive"]),
        )  # fmt: skip

    async def _start_what_fits(self) -> None:
        while True:
            held = self._next
            if (
                held is not None
                and held.job.tier == "batch"
                and self._buffer.count(PRIORITY["interactive"])
            ):
                # Interactive work arrived behind a batch job that was waiting for room: it
                # goes first, and the batch job goes back into the fair queue.
                self._enqueue(held)
                self._next = None
            if self._next is None:
                self._next = self._buffer.pop()
            item = self._next
            if item is None:
                return
            load = self._engine_load()
            tier = item.job.tier
            if self._policy.can_start(load, item.tokens, tier, item.job.team):
                self._next = None
                self._start(item)
                continue
            other = self._other_team(load, item)
            if other is not None:  # another team's job may take the slot this one may not
                self._start(other)
                continue
            if tier == "interactive" and self._policy.preemption_needed(
                load, tier, item.tokens, item.job.team
            ):
                victim = self._policy.choose_victim(self._load.running_jobs())
                if victim is not None and await self._running.preempt(victim.request_id, load):
                    continue
            if item.job.request_id not in self._waited:  # once per job: why it waits
                self._waited.add(item.job.request_id)
                log.debug("job_waiting", request_id=item.job.request_id, team=item.job.team,
                          **load.teams_summary())  # fmt: skip
            return

    def _other_team(self, load: EngineLoad, held: Fetched) -> Fetched | None:
        """A buffered job of the held job's class from a team that may still start one, when
        the held job's team may not (it holds its share, or only the reserve is free)."""
        team = held.job.team
        if self._policy.free_slots(load) == 0 or self._policy.slots_for(load, team) > 0:
            return None
        item = self._buffer.pop_team(
            PRIORITY[held.job.tier], lambda other: self._policy.slots_for(load, other) > 0
        )
        if item is not None and not self._policy.can_start(
            load, item.tokens, item.job.tier, item.job.team
        ):
            self._enqueue(item)  # no KV room either: put it back (it keeps no head start)
            return None
        return item

    async def _fetch(self) -> int:
        load = self._engine_load()
        budget = self._policy.fetch_budget(load)
        held = [*self._buffer.items(), *([self._next] if self._next else [])]
        # A job held only because its team is at its share (slots are free) must not hide
        # another team's job behind it in its partition: that partition stays open.
        free = self._policy.free_slots(load) > 0
        blocking = {
            f.tp for f in held if not (free and self._policy.slots_for(load, f.job.team) == 0)
        }
        held_interactive = sum(1 for f in held if f.job.tier == "interactive")
        assignment = self._consumer.assignment()
        plan = plan_fetch(
            budget,
            held_interactive=held_interactive,
            held_batch=len(held) - held_interactive,
            lookahead=self._lookahead,
            partitions={
                cls: [tp for tp in assignment if tp.topic == topic]
                for cls, topic in self._topics.items()
            },
            waiting_in=blocking,
            most_buffered=self._lookahead + 2 * self._engine.max_num_seqs,
        )
        if self._caught_up.quiet(assignment, time.monotonic()):
            self._consumer.pause(*assignment)  # nothing new until a job is announced
            return 0
        self._consumer.pause(*plan.pause)
        self._consumer.resume(*plan.resume)
        if plan.max_records <= 0 or not assignment:
            self._caught_up.not_fetched(assignment)
            if not assignment:
                await asyncio.sleep(IDLE_WAIT_S)  # still joining the group
            return 0
        self._caught_up.not_fetched(plan.pause)
        started_at = time.monotonic()
        batches = await self._fetch_or_start(plan.max_records)
        found = {tp: len(records) for tp, records in batches.items()}
        self._caught_up.fetched(plan.resume, found, started_at, time.monotonic())
        count = 0
        for tp, records in batches.items():
            for record in records:
                await self._accept(tp, record.offset, record.value)
                count += 1
        return count

    async def _fetch_or_start(self, max_records: int) -> dict[TopicPartition, list[Any]]:
        """Fetch (up to IDLE_WAIT_S); a slot freeing meanwhile starts a held job at once."""
        fetch = self._consumer.getmany(timeout_ms=IDLE_WAIT_S * 1000, max_records=max_records)
        batches: dict[TopicPartition, list[Any]] = await wake_during(
            fetch, self._wake, self._start_what_fits, self._stopping
        )
        return batches

    async def _accept(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        self.offsets.started(tp, offset)
        try:
            job = InferenceJob.model_validate_json(value or b"")
        except ValidationError as exc:
            if await set_aside(
                tp.topic, tp.partition, offset, value, exc, self._dead_letters, self._runner
            ):
                self.offsets.finished(tp, offset)
            return
        tokens = self._policy.job_tokens(len(job.prompt_token_ids), job.sampling.max_tokens)
        self._enqueue(Fetched(tp, offset, job, tokens))

    def _enqueue(self, item: Fetched) -> None:
        job = item.job
        self._teams.weigh(job.team, job.team_weight)
        self._teams.note_prompt(job.team, len(job.prompt_token_ids))
        self._buffer.push(
            item,
            team=job.team,
            weight=job.team_weight,
            cost=item.tokens,
            priority=PRIORITY[job.tier],
        )

    def _start(self, item: Fetched) -> None:
        self._waited.discard(item.job.request_id)
        if self._running.start(item):
            self._teams.note_started(item.job.team, len(item.job.prompt_token_ids))

    async def commit(self) -> None:
        await commit_done(self._consumer, self.offsets)

    async def abandon(self) -> None:
        """Stop every running job without committing it (crash semantics: re-delivered)."""
        await self._running.abandon()

    async def _drain(self, grace_s: float) -> None:
        self._consumer.pause(*self._consumer.assignment())
        tasks = self._running.tasks()
        log.info("drain_started", in_flight=len(tasks), buffered=self.buffered)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            if pending:
                log.warning("drain_grace_exceeded", aborted=len(pending))
                await self.abandon()
        await self.commit()
        log.info("drain_finished")
