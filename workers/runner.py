"""Runs one job through the engine and publishes what happens to it.

Every job ends in exactly one terminal event (finish or error) on its `reply_to` channel and,
when the engine ran it, one usage record that bills only the tokens that were produced. A line of
a batch file (``job.batch``) ends instead in one `BatchResultEvent` on the durable results topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from schemas.chat import FinishReason
from schemas.messages import (
    InferenceJob,
    TokenEvent,
    UsageCounts,
    UsageRecord,
    token_event_bytes,
)
from topics.catalog import attempt_key
from topics.ports import (
    AttemptRecord,
    BatchCancellations,
    CancelBus,
    DeadLetterSink,
    Delivered,
    EventPublisher,
    JobAttempts,
    JobLedger,
    JobStart,
    QueueBacklog,
    ResultSink,
    UsageSink,
)
from workers.dead_letters import dead_letter_for_failing_job
from workers.deliveries import CallerGone, Deliveries
from workers.engine.port import EngineClient, EngineRequestError, EngineStep
from workers.job_output import Buffered, JobOutput
from workers.job_start import GatheredJobStart
from workers.load import LoadTracker

log = structlog.get_logger()


@dataclass
class JobOutcome:
    outcome: str
    usage: UsageCounts


@dataclass(frozen=True)
class JobOrigin:
    """Where a job's record sits (named in its dead letter)."""

    topic: str
    partition: int
    offset: int
    fetched_at: float = 0.0
    """When the worker fetched it (wall clock): a job's queue time splits into the time in
    its partition and the time in this worker's buffer."""


class RunFailed(Exception):
    """The engine raised before the caller saw a token: run the job again (re-queue it)."""


class JobRunner:
    def __init__(
        self,
        engine: EngineClient,
        publisher: EventPublisher,
        usage: UsageSink,
        cancels: CancelBus,
        ledger: JobLedger,
        backlog: QueueBacklog,
        load: LoadTracker,
        results: ResultSink,
        batch_cancels: BatchCancellations,
        attempts: JobAttempts,
        dead_letters: DeadLetterSink,
        max_failed_runs: int = 2,
        start: JobStart | None = None,
    ) -> None:
        self._engine = engine
        self._attempts = attempts
        self._dead_letters = dead_letters
        self._max_failed_runs = max_failed_runs
        self._batch_cancels = batch_cancels
        self._publisher = publisher
        self._output = JobOutput(publisher, results)
        self._usage = usage
        self._cancels = cancels
        self._ledger = ledger
        self._client_cancelled: set[str] = set()
        self._ending: set[str] = set()
        self._backlog = backlog
        self._load = load
        self._start = start or GatheredJobStart(backlog, ledger, attempts, cancels)
        """How a job leaves the queue: its checks in one round trip where the store allows."""

    async def run(
        self,
        job: InferenceJob,
        origin: JobOrigin | None = None,
        on_engine_done: Callable[[], None] | None = None,
    ) -> JobOutcome:
        """Run `job` to a terminal event; cancelling the calling task aborts it in the engine.
        `on_engine_done` is called as soon as the engine is done with it (its sequence slot is
        free), before the outcome is recorded.

        Raises `RunFailed` when the engine raised before the caller saw a token: the job is
        re-queued (and dead-lettered once its runs have failed `max_failed_runs` times)."""
        bound = log.bind(request_id=job.request_id, team=job.team, model=job.model)
        delivered = UsageCounts()
        try:
            # Its prompt leaves the queue now (admission counts queued prompt tokens per pool;
            # the job's share of slot time stays counted until it ends: `_free_slot`).
            # One round trip before the engine, not four. (A run of a finished job also
            # counts a start, harmless: it never runs again.)
            key = attempt_key(job.request_id, job.replay.replay_id if job.replay else None)
            checks = await self._start.begin(job, key)
            finished, earlier, cancelled = checks.finished, checks.earlier, checks.cancelled
            forced = job.replay is not None and job.replay.force
            if finished and not forced:
                bound.info("job_skipped_finished")
                await self._free_slot(job)  # a replay's (counted as it was queued again)
                return JobOutcome("duplicate", UsageCounts())
            delivered = earlier.delivered
            if cancelled:
                await self._finished(job, "cancelled", delivered, time.time())
                return JobOutcome("cancelled", delivered)
            ended = await self._ended_before_running(job, earlier, origin)
            if ended is not None:
                return ended
        except asyncio.CancelledError:
            if job.request_id in self._client_cancelled:
                # Its client cancelled it before it reached the engine: that is its end too,
                # recorded (and its quota reservation refunded) like any other.
                self._client_cancelled.discard(job.request_id)
                await self._finished(job, "cancelled", delivered, time.time())
            raise

        started = time.time()
        # Usage as plain numbers per token; `usage()` builds the record when one is needed.
        prompt_tokens, cached_tokens, completion_tokens = len(job.prompt_token_ids), 0, 0

        def usage() -> UsageCounts:
            return UsageCounts(
                prompt_tokens=prompt_tokens,
                cached_tokens=cached_tokens,
                completion_tokens=completion_tokens,
            )

        deliveries = Deliveries(job.reply_to)

        def seen() -> UsageCounts:
            """What the caller has seen: a streaming job's received events; otherwise
            (it sees the whole output at the end) what an earlier run streamed, if any."""
            received = deliveries.received if job.stream else None
            return received or earlier.delivered

        outcome = "stop"
        # Batch output is published whole at the end: a batch job may be preempted and run
        # again, and its caller must never see the restart.
        buffered: dict[int, Buffered] | None = {} if job.tier == "batch" else None
        ends: dict[int, FinishReason] = {}  # each choice's finish reason, by index
        seq = 0
        first_token_at: float | None = None
        self._load.started(job)
        try:
            async for step in self._engine.generate(job):
                prompt_tokens, cached_tokens = step.prompt_tokens, step.cached_tokens
                completion_tokens += step.num_new_tokens
                self._load.produced(job.request_id, step.num_new_tokens, step.cached_tokens)
                if step.finish_reason is not None:
                    ends[step.index] = "length" if step.finish_reason == "length" else "stop"
                if not (step.text or step.num_new_tokens):
                    continue
                if first_token_at is None:
                    first_token_at = time.time()
                if buffered is not None:
                    buffered.setdefault(step.index, Buffered()).add(step)
                    continue
                deliveries.check()  # the gateway's answers so far: is anyone still listening?
                payload = self._token_bytes(job, seq, step, earlier.attempt)
                counts = (prompt_tokens, cached_tokens, completion_tokens)
                # A streaming caller sees it now: record that, atomically with the publish.
                record = Delivered(key, *counts) if job.stream else None
                deliveries.sent(self._publisher.push(job.reply_to, payload, record), counts)
                seq += 1
            await deliveries.settle()
            self._ending.add(job.request_id)  # a cancel from now on changes nothing
            finish_reason: FinishReason = ends.get(0, "stop")
            outcome = finish_reason
            choices = job.sampling.n
            reasons = tuple(ends.get(i, "stop") for i in range(choices)) if choices > 1 else ()
            # Its slot is free before its caller hears the end: a client that sends its next
            # request at once must not find this one still counted ahead of it.
            await self._free_slot(job)
            await self._output.finished(job, buffered, finish_reason, usage(), reasons, started)
            final = usage()
        except asyncio.CancelledError:
            self._ending.discard(job.request_id)
            if job.request_id not in self._client_cancelled:
                # A preemption or a shutdown, not an end: the job runs again (re-queued, or
                # its offset stays uncommitted). This run ended cleanly: not a failed run.
                with contextlib.suppress(Exception):
                    await self._attempts.ended(key)
                raise
            self._client_cancelled.discard(job.request_id)
            outcome = "cancelled"
            await self._finished(job, outcome, usage(), started)
            raise
        except CallerGone:
            # No gateway holds the request any more (it restarted, or its relay was cut and
            # it ended the stream): stop, and bill what reached a gateway.
            with contextlib.suppress(Exception):
                await self._engine.abort(job.request_id)
            outcome = "caller_gone"
            final = deliveries.received or UsageCounts(prompt_tokens=prompt_tokens)
            bound.info("job_abandoned", reason="no gateway listens", tokens=final.completion_tokens)
        except EngineRequestError as exc:  # the same on every run: answer it, do not retry
            await deliveries.settle_quietly()
            outcome, final = exc.code, seen()
            bound.info("job_refused_by_engine", tokens=final.completion_tokens)
            await self._output.error(
                job, exc.code, f"The engine refused this request: {exc}", final
            )
        except Exception as exc:
            bound.error("job_failed", error=type(exc).__name__, attempt=earlier.attempt)
            await deliveries.settle_quietly()  # what the caller saw decides: re-run or end
            final = seen()
            if final.completion_tokens == 0:
                raise RunFailed(type(exc).__name__) from exc  # re-queued; the caller saw nothing
            outcome = "engine_error"
            await self._output.error(
                job, "engine_error", "The engine failed while running this request.", final
            )
        finally:
            self._load.finished(job.request_id)
            if on_engine_done is not None:
                on_engine_done()
        try:
            await self._finished(job, outcome, final, started, first_token_at, origin)
        finally:
            self._ending.discard(job.request_id)
        return JobOutcome(outcome, final)

    @staticmethod
    def _token_bytes(job: InferenceJob, seq: int, step: EngineStep, attempt: int) -> bytes:
        """One step's token event as JSON (built directly unless it carries log probabilities:
        per token, a model costs more than everything else the worker does)."""
        if step.logprobs is None:
            return token_event_bytes(
                job.request_id, seq, step.text, step.num_new_tokens, attempt, step.index,
                time.time(),
            )  # fmt: skip
        return TokenEvent(
            request_id=job.request_id, seq=seq, text=step.text, num_tokens=step.num_new_tokens,
            attempt=attempt, logprobs=step.logprobs, index=step.index, generated_at=time.time(),
        ).to_bytes()  # fmt: skip

    async def _ended_before_running(
        self, job: InferenceJob, earlier: AttemptRecord, origin: JobOrigin | None
    ) -> JobOutcome | None:
        """The ends a job meets before the engine: its batch was cancelled, it expired, it
        keeps failing, or an earlier run already streamed to its caller."""
        bound = log.bind(request_id=job.request_id, team=job.team, attempt=earlier.attempt)
        if job.batch is not None and await self._batch_cancels.is_batch_cancelled(
            job.batch.batch_id
        ):
            await self._output.error(
                job, "batch_cancelled", "The batch was cancelled before this line ran."
            )
            await self._finished(job, "cancelled", UsageCounts(), time.time())
            return JobOutcome("cancelled", UsageCounts())
        delivered = earlier.delivered  # what an earlier run streamed: billed whatever ends it
        if time.time() > job.deadline:
            await self._output.error(
                job,
                "batch_expired" if job.batch is not None else "deadline_exceeded",
                "The request expired in the queue before a worker could start it.",
                delivered,
            )
            bound.info("job_expired", late_s=round(time.time() - job.deadline, 3))
            await self._finished(job, "deadline_exceeded", delivered, time.time())
            return JobOutcome("deadline_exceeded", delivered)
        if earlier.failed >= self._max_failed_runs:
            if origin is not None:  # without one (a test calling run() directly), just fail
                await self._dead_letters.publish(
                    dead_letter_for_failing_job(
                        job, origin.topic, origin.partition, origin.offset, earlier.failed
                    )
                )
            bound.warning("job_dead_lettered", reason="engine_failed", failed_runs=earlier.failed)
            await self._output.error(
                job,
                "engine_failed",
                f"The request failed on {earlier.failed} runs and was set aside.",
                delivered,
            )
            await self._finished(job, "engine_failed", delivered, time.time())
            return JobOutcome("engine_failed", delivered)
        if job.stream and job.batch is None and delivered.completion_tokens > 0:
            # Its caller saw tokens from a run that died: re-running would repeat text.
            bound.info("job_interrupted", delivered_tokens=delivered.completion_tokens)
            await self._output.error(
                job,
                "stream_interrupted",
                "The worker running this request stopped after streaming "
                f"{delivered.completion_tokens} tokens; retry the request.",
                delivered,
            )
            await self._finished(job, "interrupted", delivered, time.time())
            return JobOutcome("interrupted", delivered)
        return None

    async def tell_unreadable(self, request_id: str, reply_to: str) -> None:
        """End the request of a record that went to the dead-letter topic: its caller learns
        now, not at its deadline. Nothing ran, so nothing is billed."""
        await self._output.unreadable(request_id, reply_to)

    def cancelled_by_client(self, request_id: str) -> bool:
        """Mark a running job's coming cancellation as its end (not a shutdown); False when
        the job already produced its last token (let it record its outcome undisturbed)."""
        if request_id in self._ending:
            return False
        self._client_cancelled.add(request_id)
        return True

    async def _free_slot(self, job: InferenceJob) -> None:
        """Uncount the job's slot share in its pool's backlog (once, however many of its
        runs and ends reach here)."""
        if job.slot_units:
            replay_id = job.replay.replay_id if job.replay else None
            await self._backlog.free_slot(
                job.pool, job.tier, job.slot_units, job.team, job.request_id, replay_id
            )

    async def _finished(
        self,
        job: InferenceJob,
        outcome: str,
        usage: UsageCounts,
        started: float,
        first_token_at: float | None = None,
        origin: JobOrigin | None = None,
    ) -> None:
        """A terminal outcome: remember it, and bill exactly the tokens produced (once: a
        second run reaching an outcome, e.g. a worker thought dead, bills nothing)."""
        await self._free_slot(job)  # (once, whichever end reaches it first)
        first = await self._ledger.mark_finished(job.request_id)
        forced = job.replay is not None and job.replay.force
        if not first and not forced:
            log.warning("job_finished_twice", request_id=job.request_id, outcome=outcome)
            return
        await self._usage.record(
            UsageRecord(
                request_id=job.request_id,
                team=job.team,
                model=job.model,
                model_version=job.model_version,
                adapter=job.adapter.id if job.adapter is not None else None,
                arm=job.arm,
                tier=job.tier,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
                # A forced re-run of a finished job reserved nothing new: refund nothing twice.
                reserved_tokens=job.reserved_tokens if first else 0,
                finish_reason=outcome,
                finished_at=time.time(),
                caller=job.caller,
            )
        )
        log.info(
            "job_finished",
            request_id=job.request_id,
            team=job.team,
            outcome=outcome,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            seconds=round(time.time() - started, 4),
            queued_s=round(started - job.created_at, 4),
            first_token_s=None if first_token_at is None else round(first_token_at - started, 4),
            replay_id=job.replay.replay_id if job.replay else None,
            buffered_s=round(started - origin.fetched_at, 4)
            if origin and origin.fetched_at
            else None,
        )
