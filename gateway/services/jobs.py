"""Produced jobs and their events: what chat completions and completions share.

A request's job is produced only after the gateway listens on its reply channel; its events
are then relayed up to the terminal one, and a request its caller abandons is cancelled, so it
stops running and stops being billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from gateway.errors import ApiError
from gateway.metrics import UNROUTED, GatewayMetrics, job_labels
from gateway.services.admission import TtftPrediction
from gateway.services.arms import ArmRecorder
from gateway.services.intake import AdmittedJob, JobIntake
from schemas.deployment import version_ref
from schemas.generation import ServiceTier
from schemas.messages import (
    AdapterRef,
    CancelEvent,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
)
from schemas.tools import ToolPlan
from topics.ports import CancelBus, ReplyEventT, ReplyRelay, ReplySubscription

log = structlog.get_logger()


def served_tier(job: InferenceJob) -> ServiceTier:
    """OpenAI's name for the tier that served a job: the batch tier is its `flex`."""
    return "flex" if job.tier == "batch" else "default"


def fingerprint(job: InferenceJob) -> str | None:
    """`system_fingerprint` of a job's responses: `name@version` of the deployment that ran
    it (which the OpenAI SDK exposes), so callers can tell versions apart."""
    return version_ref(job.model, job.model_version)


ADAPTER_LOAD_FAILED = "adapter_load_failed"
"""The error code of a job whose LoRA adapter its worker's engine could not load."""
AdapterFailed = Callable[[AdapterRef, str], Coroutine[Any, Any, None]]
"""Records that an adapter cannot be loaded (`AdaptersService.mark_failed_ref`)."""


def api_error_of(event: ErrorEvent) -> ApiError:
    """The HTTP answer to a job that failed: 400 when the engine refused the request itself,
    504 when it ran out of time, 500 otherwise."""
    if event.code in ("invalid_request", ADAPTER_LOAD_FAILED):
        return ApiError(400, event.message, code=event.code)
    status = 504 if event.code in ("timeout", "deadline_exceeded") else 500
    return ApiError(status, event.message, type_="server_error", code=event.code)


@dataclass
class ActiveRequest:
    """A produced job whose events this gateway is waiting for."""

    job: InferenceJob
    subscription: ReplySubscription
    arrived: float
    created: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    attempt: int = 0
    """The run of the job whose tokens this request relays (0 until the first token)."""
    outcome: str = "abandoned"
    prediction: TtftPrediction | None = None
    """Admission's predicted time to first token (interactive jobs)."""
    tools: ToolPlan | None = None
    """How the answer becomes tool calls (chat requests with a tool choice)."""
    _done: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)


class JobRelay:
    """Produces admitted jobs and relays their events: the part every generation endpoint
    shares (chat and completions services extend it)."""

    def __init__(
        self,
        intake: JobIntake,
        relay: ReplyRelay,
        cancels: CancelBus,
        metrics: GatewayMetrics,
        arms: ArmRecorder | None = None,
        adapter_failed: AdapterFailed | None = None,
    ) -> None:
        self._intake = intake
        self._adapter_failed = adapter_failed
        self._arms = arms
        self._relay = relay
        self._cancels = cancels
        self._metrics = metrics
        self._background: set[asyncio.Task[None]] = set()

    def require_relay(self, team: str) -> None:
        """Refuse quickly (503) while the token relay reconnects: events would be lost."""
        if not self._relay.connected:
            refusal = ApiError(
                503,
                "The token relay is reconnecting; retry shortly.",
                type_="server_error",
                code="relay_unavailable",
                headers={"Retry-After": "1"},
            )
            self._metrics.refused(UNROUTED, team, refusal.status, refusal.code)
            raise refusal

    def refused(self, model: str, team: str, refusal: ApiError) -> None:
        """Count a request admission refused; a model name nobody serves is not a label."""
        served = refusal.code != "model_not_found"
        self._metrics.refused(model if served else UNROUTED, team, refusal.status, refusal.code)

    async def launch(self, admitted: AdmittedJob) -> ActiveRequest:
        """Listen for an admitted job's events, then produce it."""
        job = admitted.job
        subscription = self._relay.open(job.request_id)
        try:
            receipt = await self._intake.produce(admitted)
        except ApiError:
            self._relay.close(job.request_id)
            self._metrics.requests.labels(*job_labels(job), "503").inc()
            # A send that timed out may still reach the broker: a worker then drops the job
            # (its cancel key is checked before it starts), so it is neither run nor billed.
            with contextlib.suppress(Exception):
                await self._cancels.cancel(CancelEvent(request_id=job.request_id))
            raise
        log.info(
            "job_produced",
            request_id=job.request_id,
            team=job.team,
            model=job.model,
            tier=job.tier,
            partition=receipt.partition,
            offset=receipt.offset,
            prompt_tokens=len(job.prompt_token_ids),
            predicted_ttft_s=_rounded(admitted.prediction),
        )
        return ActiveRequest(
            job=job,
            subscription=subscription,
            arrived=job.created_at,
            created=int(job.created_at),
            prediction=admitted.prediction,
            tools=admitted.tools,
        )

    async def events(self, active: ActiveRequest) -> AsyncIterator[ReplyEventT]:
        """The job's events up to its terminal one; an abandoned request is cancelled."""
        job = active.job
        subscription = active.subscription
        subscription.end_at(
            job.deadline,
            ErrorEvent(
                request_id=job.request_id,
                code="timeout",
                message="The request did not finish before its deadline.",
            ),
        )
        try:
            while True:
                event = await subscription.next_event()
                if isinstance(event, TokenEvent) and not self._same_run(active, event):
                    continue
                self._observe(active, event)
                if not isinstance(event, TokenEvent):
                    # Done before the caller sees it: a caller that stops iterating at the
                    # terminal event must not turn a finished request into a cancel. A relay
                    # cut is no end of the job: it is cancelled, so it stops being billed.
                    active._done = not subscription.interrupted
                    yield event
                    return
                yield event
        finally:
            self._finish(active)

    @staticmethod
    def _same_run(active: ActiveRequest, event: TokenEvent) -> bool:
        """Whether to relay a token event. A job whose worker died before its caller saw a
        token runs again: a stream keeps the first run it relayed (a later run only starts
        when the first streamed nothing); a buffered answer keeps the latest run."""
        if event.attempt == active.attempt:
            return True
        if active.attempt == 0 or (not active.job.stream and event.attempt > active.attempt):
            active.attempt = event.attempt
            active.tokens = 0
            return True
        return False

    def _observe(self, active: ActiveRequest, event: ReplyEventT) -> None:
        now = time.time()
        if isinstance(event, TokenEvent) and event.num_tokens > 0:
            if active.first_token_at is None:
                active.first_token_at = now
                actual = now - active.arrived
                self._metrics.ttft.labels(*job_labels(active.job)).observe(actual)
                self._metrics.recent.ttft(active.job.model, actual)
                if active.prediction is not None:
                    job = active.job
                    self._metrics.observe_prediction(job.model, active.prediction.ttft_s, actual)
                    factor = self._intake.observe_ttft(job, active.prediction, actual)
                    self._metrics.ttft_calibration.labels(job.pool).set(factor)
            active.last_token_at = now
            active.tokens += event.num_tokens
        elif isinstance(event, FinishEvent):
            active.outcome = "ok"
            self._metrics.observe_prompt(job_labels(active.job), event.usage)
            if event.started_at is not None:  # the worker's clock: never below 0
                waited = max(0.0, event.started_at - active.arrived)
                self._metrics.queue_time.labels(*job_labels(active.job)).observe(waited)
        elif isinstance(event, ErrorEvent):
            active.outcome = event.code
            adapter = active.job.adapter
            if event.code == ADAPTER_LOAD_FAILED and adapter and self._adapter_failed:
                self._spawn(self._adapter_failed(adapter, event.message))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work that no caller waits for (kept referenced until it is done)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.warning("background_task_failed", error=type(error).__name__)

    def _finish(self, active: ActiveRequest) -> None:
        """Once per request: stop listening, cancel it if abandoned, record metrics."""
        if active._closed:
            return
        active._closed = True
        job = active.job
        model = job.model
        self._relay.close(job.request_id)
        if not active._done:
            self._spawn(self._cancels.cancel(CancelEvent(request_id=job.request_id)))
        if job.adapter is not None:
            self._spawn(self._intake.ended(job))
        labels = job_labels(job)
        self._metrics.requests.labels(*labels, active.outcome).inc()
        self._metrics.recent.finished(model, active.outcome)
        if job.adapter is not None:
            self._metrics.observe_adapter(job, active.outcome, active.tokens)
        now = time.time()
        self._metrics.e2e.labels(*labels).observe(now - active.arrived)
        ttft = active.first_token_at - active.arrived if active.first_token_at else None
        tpot = None
        if active.first_token_at and active.last_token_at and active.tokens > 1:
            tpot = (active.last_token_at - active.first_token_at) / (active.tokens - 1)
            self._metrics.tpot.labels(*labels).observe(tpot)
            self._metrics.recent.tpot(model, tpot)
        if self._arms is not None:
            self._arms.finished(job, active.outcome, ttft, tpot)
        log.info(
            "request_finished",
            request_id=job.request_id,
            team=job.team,
            model=model,
            adapter=job.adapter.id if job.adapter is not None else None,
            outcome=active.outcome,
            completion_tokens=active.tokens,
            ttft_s=None if ttft is None else round(ttft, 4),
            e2e_s=round(now - active.arrived, 4),
            **_predicted(active.prediction),
        )


def _predicted(prediction: TtftPrediction | None) -> dict[str, float | str | None]:
    """A prediction and its raw waits, for a request's last log line."""
    if prediction is None:
        return {"predicted_ttft_s": None}
    return {
        "predicted_ttft_s": round(prediction.ttft_s, 4),
        "predicted_basis": prediction.basis,
        "predicted_wait_s": round(prediction.wait_s, 4),
        "predicted_prefill_s": round(prediction.prefill_s, 4),
        "predicted_slot_wait_s": round(prediction.slot_wait_s, 4),
        "predicted_running": prediction.running,
        "pool_predicted_ttft_s": _rounded(prediction.pool_prediction),
        "pool_predicted_wait_s": (
            None
            if prediction.pool_prediction is None
            else round(prediction.pool_prediction.wait_s, 4)
        ),
    }


def _rounded(prediction: TtftPrediction | None) -> float | None:
    """A prediction for a log line."""
    return None if prediction is None else round(prediction.ttft_s, 4)
