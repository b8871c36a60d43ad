"""Chat completions: validate, render, produce the job, and turn its events into responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import structlog

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.services.chunk_json import ContentChunkJson
from gateway.services.jobs import ActiveRequest, JobRelay, api_error_of, fingerprint, served_tier
from gateway.services.tool_calls import ToolCallAnswer
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
)
from schemas.messages import ErrorEvent, FinishEvent, TokenEvent, UsageCounts

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


class ChatService(JobRelay):
    """Chat completions over the queue: admit, produce, then relay the job's events."""

    async def start(self, request: ChatCompletionRequest, team: Team) -> ActiveRequest:
        """Admit the request, listen for its events, then produce its job."""
        self.require_relay(team.name)
        try:
            admitted = await self._intake.admit(request, team, self._relay.channel)
        except ApiError as exc:
            self.refused(request.model, team.name, exc)
            raise
        return await self.launch(admitted)

    async def stream_chunks(
        self, active: ActiveRequest, include_usage: bool, continuous_usage: bool = False
    ) -> AsyncIterator[ChatCompletionChunk | str | ErrorEvent]:
        """`chat.completion.chunk`s in OpenAI's order; an `ErrorEvent` ends a failed stream.

        Nothing is sent before the first generated token: the assistant's role travels with
        it, in the same chunk, as vLLM and OpenAI do. Benchmark clients time the first event
        as the first token; an early role chunk would make TTFT read as the queueing time.
        With `continuous_usage` (vLLM's `continuous_usage_stats`) every chunk also carries
        the usage so far. The common chunk (choice 0's next text, nothing else) comes as its
        JSON already rendered (`ContentChunkJson`)."""
        job = active.job
        fast = ContentChunkJson(
            job.request_id, active.created, job.requested_model, served_tier(job), fingerprint(job)
        )

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
                model=job.requested_model,
                choices=choices,
                usage=usage,
                service_tier=served_tier(job),
                system_fingerprint=fingerprint(job),
            )

        named: set[int] = set()  # choices whose first chunk carried the role

        def role(index: int) -> Literal["assistant"] | None:
            if index in named:
                return None
            named.add(index)
            return "assistant"

        plan = active.tools
        answers: dict[int, ToolCallAnswer] = {}

        def answer(index: int) -> ToolCallAnswer | None:
            if plan is None:
                return None
            return answers.setdefault(index, ToolCallAnswer(plan))

        try:
            async for event in self.events(active):
                if isinstance(event, TokenEvent):
                    calls = answer(event.index)
                    if calls is not None:  # tool calls: arguments stream, or wait for the end
                        delta = calls.delta(event.text)
                        if delta is not None:
                            delta.role = role(event.index)
                            yield chunk(delta, index=event.index)
                    elif (
                        event.index == 0 and 0 in named and not (event.logprobs or continuous_usage)
                    ):
                        if event.text:
                            yield fast.render(event.text)
                    elif event.text or event.logprobs:
                        yield chunk(
                            ChoiceDelta(role=role(event.index), content=event.text),
                            logprobs=_choice_logprobs(event.logprobs),
                            index=event.index,
                        )
                elif isinstance(event, FinishEvent):
                    for index, reason in enumerate(_finish_reasons(event)):
                        calls = answer(index)
                        if calls is not None:
                            last, reason = calls.last_delta(reason)
                            if last is not None:
                                last.role = role(index)
                                yield chunk(last, index=index)
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
                choices = []
                for index, reason in enumerate(_finish_reasons(event)):
                    text = "".join(parts.get(index, []))
                    message = ChatCompletionMessage(content=text)
                    if active.tools is not None:
                        message, reason = ToolCallAnswer(active.tools).message(text, reason)
                    choices.append(
                        Choice(
                            index=index,
                            message=message,
                            finish_reason=reason,
                            logprobs=ChoiceLogprobs(content=logprobs.get(index, []))
                            if wants_logprobs
                            else None,
                        )
                    )
                return ChatCompletion(
                    id=active.job.request_id,
                    created=active.created,
                    model=active.job.requested_model,
                    choices=choices,
                    usage=completion_usage(event.usage),
                    service_tier=served_tier(active.job),
                    system_fingerprint=fingerprint(active.job),
                )
            else:
                raise api_error_of(event)
        raise ApiError(500, "The request ended without a result.", type_="server_error")
