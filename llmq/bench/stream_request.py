"""One streamed chat completion, timed by its content chunks (`one_request`), and re-sending
it after a refusal's Retry-After, as the OpenAI SDK does (it retries a 429 twice by default,
waiting what the header says): what a closed loop of real clients does against a server that
sheds load, where re-sending at once would spend a round's requests on refusals within a
second.

The sample keeps the caller's view: its TTFT and end-to-end time count from the first send,
so the waits a refusal cost are in them, and a request still refused after the last retry is
an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import openai
from pydantic import BaseModel, Field

REFUSED = "RateLimitError"
"""How a refusal's error starts (the OpenAI SDK's exception for a 429)."""

MAX_WAIT_S = 30.0
"""The longest Retry-After honoured (a longer one is waited this long)."""


class RequestSample(BaseModel):
    """One measured request (times in seconds)."""

    ttft_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)
    output_tokens: int = 0
    usage_reported: bool = False
    e2e_s: float = 0.0
    error: str | None = None
    retry_after_s: float | None = None
    """A refusal's Retry-After."""
    refusals: int = 0
    """Refusals before this answer (`retry_refused`); its times count from the first."""


async def one_request(
    client: openai.AsyncOpenAI,
    model: str,
    prompt: str,
    max_tokens: int,
    extra_body: dict[str, object] | None = None,
) -> RequestSample:
    """Send one streaming chat completion and time its content chunks."""
    sample = RequestSample()
    start = time.perf_counter()
    last: float | None = None
    chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra_body,
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                sample.output_tokens = chunk.usage.completion_tokens
                sample.usage_reported = True
            if not chunk.choices or not chunk.choices[0].delta.content:
                continue
            chunks += 1
            if last is None:
                sample.ttft_s = now - start
            else:
                sample.itl_s.append(now - last)
            last = now
    except openai.OpenAIError as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, openai.APIStatusError) and "retry-after" in exc.response.headers:
            sample.retry_after_s = float(exc.response.headers["retry-after"])
    sample.e2e_s = time.perf_counter() - start
    if not sample.usage_reported:
        sample.output_tokens = chunks  # about one token per chunk; flagged in the sample
    return sample


async def send_with_retries(
    send: Callable[[], Awaitable[RequestSample]], retries: int
) -> RequestSample:
    """`send` until it is not refused or `retries` re-sends are spent, waiting each refusal's
    Retry-After (1 s without one); the sample's times count from the first send."""
    start = time.perf_counter()
    refusals = 0
    while True:
        sent_at = time.perf_counter()
        sample = await send()
        refused = sample.error is not None and sample.error.startswith(REFUSED)
        if not refused or refusals >= retries:
            break
        refusals += 1
        await asyncio.sleep(min(sample.retry_after_s or 1.0, MAX_WAIT_S))
    waited = sent_at - start
    if sample.ttft_s is not None:
        sample.ttft_s += waited
    sample.e2e_s += waited
    sample.refusals = refusals
    return sample
