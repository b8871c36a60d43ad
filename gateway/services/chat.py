"""Chat completions: validate, render, produce the job, and turn its events into responses."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import structlog

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.services.intake import JobIntake
from schemas.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionTokenLogprob,
    Choice,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionUsage,
    FinishReason,
    ServiceTier,
)
from schemas.messages import (
    CancelEvent,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    TokenEvent,
    UsageCounts,
)
from topics.ports import CancelBus, ReplyEventT, ReplyRelay, ReplySubscription

log = structlog.get_logger()


def completion_usage(usage: UsageCounts) -> CompletionUsage:
    return usage.to_openai()


def _choice_logprobs(
    tokens: tuple[ChatCompletionTokenLogprob, ...] | None,
) -> ChoiceLogprobs | None:
    return None if tokens is None else ChoiceLogprobs(content=list(tokens))


def _finish_reasons(event: FinishEvent) -> tuple[FinishReason, ...]:
    """Each choice's finish reason, by index (one choice unless the request asked for n)."""
    return event.finish_reasons or (event.finish_reason,)


def served_tier(job: InferenceJob) -> ServiceTier:
    """OpenAI's name for the tier that served a job: the batch tier is its `flex`."""
    return "flex" if job.tier == "batch" else "default"


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
    _done: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)


class ChatService:
    """Chat completions over the queue: admit, produce, then relay the job's events."""

    def __init__(
        self,
        intake: JobIntake,
        relay: ReplyRelay,
        cancels: CancelBus,
        metrics: GatewayMetrics,
    ) -> None:
        self._intake = intake
        self._relay = relay
        self._cancels = cancels
        self._metrics = metrics
        self._background: set[asyncio.Task[None]] = set()

    async def start(self, request: ChatCompletionRequest, team: Team) -> ActiveRequest:
        """Admit the request, listen for its events, then produce its job."""
        try:
            if not self._relay.connected:  # its events would be lost: refuse, quickly
                raise ApiError(
                    503,
                    "The token relay is reconnecting; retry shortly.",
                    type_="server_error",
                    code="relay_unavailable",
                    headers={"Retry-After": "1"},
                )
            admitted = await self._intake.admit(request, team, self._relay.channel)
        except ApiError as exc:
            self._metrics.requests.labels(request.model, str(exc.status)).inc()
            raise
        job = admitted.job
        subscription = self._relay.open(job.request_id)
        try:
            receipt = await self._intake.produce(admitted)
        except ApiError:
            self._relay.close(job.request_id)
            self._metrics.requests.labels(job.model, "503").inc()
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
        )
        return ActiveRequest(
            job=job, subscription=subscription, arrived=job.created_at, created=int(job.created_at)
        )

    async def events(self, active: ActiveRequest) -> AsyncIterator[ReplyEventT]:
        """The job's events up to its terminal one; an abandoned request is cancelled."""
        job = active.job
        subscription = active.subscription
        try:
            while True:
                remaining = job.deadline - time.time()
                try:
                    async with asyncio.timeout(max(remaining, 0.0)):
                        event = await subscription.next_event()
                except TimeoutError:
                    event = ErrorEvent(
                        request_id=job.request_id,
                        code="timeout",
                        message="The request did not finish before its deadline.",
                    )
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
                self._metrics.ttft.labels(active.job.model).observe(now - active.arrived)
            active.last_token_at = now
            active.tokens += event.num_tokens
        elif isinstance(event, FinishEvent):
            active.outcome = "ok"
        elif isinstance(event, ErrorEvent):
            active.outcome = event.code

    def _finish(self, active: ActiveRequest) -> None:
        """Once per request: stop listening, cancel it if abandoned, record metrics."""
        if active._closed:
            return
        active._closed = True
        job = active.job
        model = job.model
        self._relay.close(job.request_id)
        if not active._done:
            task = asyncio.create_task(self._cancels.cancel(CancelEvent(request_id=job.request_id)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        self._metrics.requests.labels(model, active.outcome).inc()
        now = time.time()
        self._metrics.e2e.labels(model).observe(now - active.arrived)
        if active.first_token_at and active.last_token_at and active.tokens > 1:
            tpot = (active.last_token_at - active.first_token_at) / (active.tokens - 1)
            self._metrics.tpot.labels(model).observe(tpot)
        log.info(
            "request_finished",
            request_id=job.request_id,
            team=job.team,
            model=model,
            outcome=active.outcome,
            completion_tokens=active.tokens,
            ttft_s=round(active.first_token_at - active.arrived, 4)
            if active.first_token_at
            else None,
            e2e_s=round(now - active.arrived, 4),
        )

    async def stream_chunks(
        self, active: ActiveRequest, include_usage: bool, continuous_usage: bool = False
    ) -> AsyncIterator[ChatCompletionChunk | ErrorEvent]:
        """`chat.completion.chunk`s in OpenAI's order; an `ErrorEvent` ends a failed stream.

        Nothing is sent before the first generated token: the assistant's role travels with
        it, in the same chunk, as vLLM and OpenAI do. Benchmark clients time the first event
        as the first token; an early role chunk would make TTFT read as the queueing time.
        With `continuous_usage` (vLLM's `continuous_usage_stats`) every chunk also carries
        the usage so far."""
        job = active.job

        def chunk(
            delta: ChoiceDelta,
            finish: str | None = None,
            usage: CompletionUsage | None = None,
            logprobs: ChoiceLogprobs | None = None,
            index: int = 0,
        ) -> ChatCompletionChunk:
            choice = ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
            choices = [] if usage else [choice]
            if continuous_usage and usage is None:
                usage = completion_usage(
                    UsageCounts(
                        prompt_tokens=len(job.prompt_token_ids), completion_tokens=active.tokens
                    )
                )
            return ChatCompletionChunk(
                id=job.request_id,
                created=active.created,
                model=job.model,
                choices=choices,
                usage=usage,
                service_tier=served_tier(job),
            )

        named: set[int] = set()  # choices whose first chunk carried the role

        def role(index: int) -> Literal["assistant"] | None:
            if index in named:
                return None
            named.add(index)
            return "assistant"

        try:
            async for event in self.events(active):
                if isinstance(event, TokenEvent):
                    if event.text or event.logprobs:
                        yield chunk(
                            ChoiceDelta(role=role(event.index), content=event.text),
                            logprobs=_choice_logprobs(event.logprobs),
                            index=event.index,
                        )
                elif isinstance(event, FinishEvent):
                    for index, reason in enumerate(_finish_reasons(event)):
                        if index not in named:  # an empty answer still names its role
                            yield chunk(ChoiceDelta(role=role(index), content=""), index=index)
                        yield chunk(ChoiceDelta(), finish=reason, index=index)
                    if include_usage:
                        yield chunk(ChoiceDelta(), usage=completion_usage(event.usage))
                else:
                    yield event
        finally:
            self._finish(active)

    async def complete(self, active: ActiveRequest) -> ChatCompletion:
        """Buffer the whole answer into one `chat.completion`."""
        parts: dict[int, list[str]] = {}
        logprobs: dict[int, list[ChatCompletionTokenLogprob]] = {}
        attempt = 0
        async for event in self.events(active):
            if isinstance(event, TokenEvent):
                if event.attempt != attempt:  # a new run: its text replaces the dead one's
                    attempt = event.attempt
                    parts.clear()
                    logprobs.clear()
                parts.setdefault(event.index, []).append(event.text)
                logprobs.setdefault(event.index, []).extend(event.logprobs or ())
            elif isinstance(event, FinishEvent):
                wants_logprobs = active.job.sampling.logprobs is not None
                return ChatCompletion(
                    id=active.job.request_id,
                    created=active.created,
                    model=active.job.model,
                    choices=[
                        Choice(
                            index=index,
                            message=ChatCompletionMessage(content="".join(parts.get(index, []))),
                            finish_reason=reason,
                            logprobs=ChoiceLogprobs(content=logprobs.get(index, []))
                            if wants_logprobs
                            else None,
                        )
                        for index, reason in enumerate(_finish_reasons(event))
                    ],
                    usage=completion_usage(event.usage),
                    service_tier=served_tier(active.job),
                )
            else:
                raise ApiError(
                    504 if event.code in ("timeout", "deadline_exceeded") else 500,
                    event.message,
                    type_="server_error",
                    code=event.code,
                )
        raise ApiError(500, "The request ended without a result.", type_="server_error")
