"""Completions (`/v1/completions`): every prompt runs as its own job on the queue path, and
their events merge into one `text_completion`, whole or streamed.

Choice `i * n + j` is choice `j` of prompt `i`, as OpenAI and vLLM number them. With `echo`,
a choice's text starts with its prompt; streamed, the prompt travels with the first generated
token, so no event goes out before the engine produced one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

from gateway.auth import Team
from gateway.errors import ApiError
from gateway.services.chat import completion_usage
from gateway.services.jobs import ActiveRequest, JobRelay, api_error_of, fingerprint, served_tier
from schemas.chat import ChatCompletionTokenLogprob, FinishReason
from schemas.completions import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from schemas.messages import ErrorEvent, FinishEvent, TokenEvent, UsageCounts
from topics.ports import ReplyEventT


def legacy_logprobs(
    tokens: Sequence[ChatCompletionTokenLogprob], offset: int = 0
) -> CompletionLogprobs:
    """Tokens with their log probabilities in the completions API's shape; `offset` is where
    the first token's text starts in the choice's text."""
    out = CompletionLogprobs()
    for token in tokens:
        out.text_offset.append(offset)
        offset += len(token.token)
        out.tokens.append(token.token)
        out.token_logprobs.append(token.logprob)
        out.top_logprobs.append({alt.token: alt.logprob for alt in token.top_logprobs})
    return out


@dataclass
class ActiveCompletion:
    """A completions request: one produced job per prompt."""

    request: CompletionRequest
    jobs: list[ActiveRequest]
    echoes: list[str]
    """Per prompt: the text put in front of its choices ("" without `echo`)."""

    @property
    def id(self) -> str:
        return self.jobs[0].job.request_id

    @property
    def created(self) -> int:
        return self.jobs[0].created

    def choice_index(self, prompt: int, choice: int) -> int:
        return prompt * self.request.choices + choice


@dataclass
class _Choice:
    """What one choice has produced so far."""

    text: list[str] = field(default_factory=list)
    logprobs: list[ChatCompletionTokenLogprob] = field(default_factory=list)
    started: bool = False
    offset: int = 0
    finish_reason: FinishReason | None = None


class CompletionService(JobRelay):
    """Completions over the queue: admit every prompt, produce, then merge their events."""

    async def start(self, request: CompletionRequest, team: Team) -> ActiveCompletion:
        """Admit every prompt (all or none), listen for their events, then produce them."""
        self.require_relay(team.name)
        try:
            admitted = await self._intake.admit_completion(request, team, self._relay.channel)
        except ApiError as exc:
            self.refused(request.model, team.name, exc)
            raise
        launched: list[ActiveRequest] = []
        try:
            for job in admitted:
                launched.append(await self.launch(job))
        except ApiError:
            for job in admitted[len(launched) + 1 :]:  # the failed one released its own
                await self._intake.release(job)
            for active in launched:
                self._finish(active)  # not done: its job is cancelled
            raise
        echoes = [""] * len(launched)
        if request.echo:
            echoes = [
                prompt
                if isinstance(prompt, str) and request.truncate_prompt_tokens is None
                else self._intake.prompt_text(active.job)
                for prompt, active in zip(request.prompts, launched, strict=True)
            ]
        return ActiveCompletion(request=request, jobs=launched, echoes=echoes)

    async def merged_events(
        self, active: ActiveCompletion
    ) -> AsyncGenerator[tuple[int, ReplyEventT], None]:
        """(prompt index, event) for every job's events, as they arrive, until each job's
        terminal event; leaving early (or an error ending one job) cancels the others."""
        if len(active.jobs) == 1:
            async for event in self.events(active.jobs[0]):
                yield 0, event
            return
        queue: asyncio.Queue[tuple[int, ReplyEventT | None]] = asyncio.Queue()

        async def pump(prompt: int, job: ActiveRequest) -> None:
            try:
                async for event in self.events(job):
                    queue.put_nowait((prompt, event))
            finally:
                queue.put_nowait((prompt, None))

        tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(active.jobs)]
        try:
            running = len(tasks)
            while running:
                prompt, item = await queue.get()
                if item is None:
                    running -= 1
                    continue
                yield prompt, item
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def stream_chunks(
        self, active: ActiveCompletion, include_usage: bool, continuous_usage: bool = False
    ) -> AsyncIterator[Completion | ErrorEvent]:
        """`text_completion` chunks as the jobs produce tokens; an `ErrorEvent` ends a failed
        stream. With `include_usage`, a last chunk carries the usage of all prompts."""
        choices: dict[int, _Choice] = {}
        usage = UsageCounts()
        prompt_tokens = sum(len(job.job.prompt_token_ids) for job in active.jobs)

        def chunk(
            index: int, text: str, finish: FinishReason | None = None, logprobs: bool = False
        ) -> Completion:
            state = choices.setdefault(index, _Choice())
            first = not state.started
            state.started = True
            lp = None
            if logprobs:
                lp = legacy_logprobs(state.logprobs, state.offset)
                state.offset += sum(len(t.token) for t in state.logprobs)
                state.logprobs = []
            counts = None
            if continuous_usage:
                done = sum(job.tokens for job in active.jobs)
                counts = UsageCounts(prompt_tokens=prompt_tokens, completion_tokens=done)
            prompt = index // active.request.choices
            return self._completion(
                active,
                [
                    CompletionChoice(
                        index=index,
                        text=(active.echoes[prompt] if first else "") + text,
                        finish_reason=finish,
                        logprobs=lp,
                    )
                ],
                counts,
            )

        wants_logprobs = active.request.logprobs is not None
        try:
            async with contextlib.aclosing(self.merged_events(active)) as events:
                async for prompt, event in events:
                    if isinstance(event, TokenEvent):
                        index = active.choice_index(prompt, event.index)
                        if event.text or event.logprobs:
                            state = choices.setdefault(index, _Choice())
                            state.logprobs.extend(event.logprobs or ())
                            yield chunk(index, event.text, logprobs=wants_logprobs)
                    elif isinstance(event, FinishEvent):
                        usage = _add(usage, event.usage)
                        reasons = event.finish_reasons or (event.finish_reason,)
                        for choice, reason in enumerate(reasons):
                            yield chunk(active.choice_index(prompt, choice), "", finish=reason)
                    else:
                        yield event
                        return
        finally:
            for job in active.jobs:
                self._finish(job)  # once per job: a job never relayed is cancelled
        if include_usage:
            yield self._completion(active, [], usage)

    async def complete(self, active: ActiveCompletion) -> Completion:
        """Buffer every prompt's answers into one `text_completion`."""
        choices: dict[int, _Choice] = {}
        attempts: dict[int, int] = {}
        usage = UsageCounts()
        async with contextlib.aclosing(self.merged_events(active)) as events:
            async for prompt, event in events:
                if isinstance(event, TokenEvent):
                    if event.attempt != attempts.get(prompt, 0):  # a new run replaces a dead one
                        attempts[prompt] = event.attempt
                        for choice in range(active.request.choices):
                            choices.pop(active.choice_index(prompt, choice), None)
                    index = active.choice_index(prompt, event.index)
                    state = choices.setdefault(index, _Choice())
                    state.text.append(event.text)
                    state.logprobs.extend(event.logprobs or ())
                elif isinstance(event, FinishEvent):
                    usage = _add(usage, event.usage)
                    reasons = event.finish_reasons or (event.finish_reason,)
                    for choice, reason in enumerate(reasons):
                        index = active.choice_index(prompt, choice)
                        choices.setdefault(index, _Choice()).finish_reason = reason
                else:
                    raise api_error_of(event)
        wants_logprobs = active.request.logprobs is not None
        n = active.request.choices
        return self._completion(
            active,
            [
                CompletionChoice(
                    index=index,
                    text=active.echoes[index // n] + "".join(state.text),
                    finish_reason=state.finish_reason or "stop",
                    logprobs=legacy_logprobs(state.logprobs) if wants_logprobs else None,
                )
                for index, state in sorted(choices.items())
            ],
            usage,
        )

    @staticmethod
    def _completion(
        active: ActiveCompletion, choices: list[CompletionChoice], usage: UsageCounts | None
    ) -> Completion:
        first = active.jobs[0].job
        return Completion(
            id=active.id,
            created=active.created,
            model=first.requested_model,
            choices=choices,
            usage=completion_usage(usage) if usage is not None else None,
            service_tier=served_tier(first),
            system_fingerprint=fingerprint(first),
        )


def _add(total: UsageCounts, more: UsageCounts) -> UsageCounts:
    return UsageCounts(
        prompt_tokens=total.prompt_tokens + more.prompt_tokens,
        cached_tokens=total.cached_tokens + more.cached_tokens,
        completion_tokens=total.completion_tokens + more.completion_tokens,
    )
