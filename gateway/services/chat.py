"""Chat completions: validate, render, produce the job, and turn its events into responses."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.services.registry import ModelRegistry
from gateway.services.render import ChatRenderer
from schemas.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    CompletionUsage,
    PromptTokensDetails,
)
from schemas.messages import (
    CancelEvent,
    ErrorEvent,
    FinishEvent,
    InferenceJob,
    SamplingSettings,
    TokenEvent,
    UsageCounts,
)
from topics.ports import CancelBus, JobQueue, ReplyEventT, ReplyRelay, ReplySubscription

log = structlog.get_logger()


def completion_usage(usage: UsageCounts) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def sampling_settings(request: ChatCompletionRequest, max_tokens: int) -> SamplingSettings:
    fmt = request.response_format
    json_schema = None
    if fmt is not None and fmt.type == "json_schema":
        json_schema = fmt.json_schema.schema_ or {"type": "object"}
    return SamplingSettings(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        frequency_penalty=request.frequency_penalty or 0.0,
        presence_penalty=request.presence_penalty or 0.0,
        stop=tuple(request.stop_list),
        seed=request.seed,
        json_schema=json_schema,
        json_object=fmt is not None and fmt.type == "json_object",
    )


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
    outcome: str = "abandoned"
    _done: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)


class ChatService:
    def __init__(
        self,
        registry: ModelRegistry,
        renderer: ChatRenderer,
        queue: JobQueue,
        relay: ReplyRelay,
        cancels: CancelBus,
        metrics: GatewayMetrics,
        request_timeout_s: float,
    ) -> None:
        self._registry = registry
        self._renderer = renderer
        self._queue = queue
        self._relay = relay
        self._cancels = cancels
        self._metrics = metrics
        self._timeout_s = request_timeout_s
        self._background: set[asyncio.Task[None]] = set()

    def build_job(self, request: ChatCompletionRequest, team: Team) -> InferenceJob:
        """Resolve the model, render the prompt and check limits (404 / 400 / 503)."""
        deployment = self._registry.resolve(request.model)
        prompt = self._renderer.render(deployment.name, request.messages)
        room = deployment.max_model_len - len(prompt)
        wanted = request.output_limit
        if room < 1 or (wanted is not None and wanted > room):
            raise ApiError(
                400,
                f"This model's maximum context length is {deployment.max_model_len} tokens. "
                f"However, you requested {len(prompt) + (wanted or 1)} tokens "
                f"({len(prompt)} in the messages, {wanted or 1} in the completion).",
                param="messages",
                code="context_length_exceeded",
            )
        self._registry.require_ready(deployment)
        now = time.time()
        return InferenceJob(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            team=team.name,
            model=deployment.name,
            pool=deployment.pool,
            tier=request.tier,
            prompt_token_ids=tuple(prompt),
            sampling=sampling_settings(request, wanted or room),
            stream=bool(request.stream),
            created_at=now,
            deadline=now + self._timeout_s,
            reply_to=self._relay.channel,
        )

    async def start(self, job: InferenceJob) -> ActiveRequest:
        """Listen for the job's events, then produce it (503 if the broker refuses)."""
        subscription = self._relay.open(job.request_id)
        try:
            receipt = await self._queue.submit(job)
        except Exception as exc:
            self._relay.close(job.request_id)
            self._metrics.requests.labels(job.model, "unavailable").inc()
            log.warning("job_produce_failed", request_id=job.request_id, error=type(exc).__name__)
            raise ApiError(
                503,
                "The request queue is unavailable; retry shortly.",
                type_="server_error",
                code="queue_unavailable",
            ) from exc
        log.info(
            "job_produced",
            request_id=job.request_id,
            team=job.team,
            model=job.model,
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
                self._observe(active, event)
                yield event
                if not isinstance(event, TokenEvent):
                    active._done = True
                    return
        finally:
            self._finish(active)

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
        self, active: ActiveRequest, include_usage: bool
    ) -> AsyncIterator[ChatCompletionChunk | ErrorEvent]:
        """`chat.completion.chunk`s in OpenAI's order; an `ErrorEvent` ends a failed stream."""
        job = active.job

        def chunk(
            delta: ChoiceDelta, finish: str | None = None, usage: CompletionUsage | None = None
        ) -> ChatCompletionChunk:
            choices = [] if usage else [ChunkChoice(delta=delta, finish_reason=finish)]
            return ChatCompletionChunk(
                id=job.request_id,
                created=active.created,
                model=job.model,
                choices=choices,
                usage=usage,
            )

        try:
            yield chunk(ChoiceDelta(role="assistant", content=""))
            async for event in self.events(active):
                if isinstance(event, TokenEvent):
                    if event.text:
                        yield chunk(ChoiceDelta(content=event.text))
                elif isinstance(event, FinishEvent):
                    yield chunk(ChoiceDelta(), finish=event.finish_reason)
                    if include_usage:
                        yield chunk(ChoiceDelta(), usage=completion_usage(event.usage))
                else:
                    yield event
        finally:
            self._finish(active)

    async def complete(self, active: ActiveRequest) -> ChatCompletion:
        """Buffer the whole answer into one `chat.completion`."""
        parts: list[str] = []
        async for event in self.events(active):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                return ChatCompletion(
                    id=active.job.request_id,
                    created=active.created,
                    model=active.job.model,
                    choices=[
                        Choice(
                            message=ChatCompletionMessage(content="".join(parts)),
                            finish_reason=event.finish_reason,
                        )
                    ],
                    usage=completion_usage(event.usage),
                )
            else:
                raise ApiError(
                    504 if event.code in ("timeout", "deadline_exceeded") else 500,
                    event.message,
                    type_="server_error",
                    code=event.code,
                )
        raise ApiError(500, "The request ended without a result.", type_="server_error")
