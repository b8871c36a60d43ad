"""A lean streaming client for load that is only a disturbance (a flood), not what is timed.

The OpenAI SDK builds a pydantic model of every streamed chunk: at 30 streamed requests a
second its client spent 37% of a core, on the same two cores as the stack it floods (a real
flood's clients run on other machines). This one sends the same request over aiohttp and reads
the stream as bytes: it parses a chunk's JSON only until the first content token is seen, and
then only the chunk that carries the usage. The steady team whose TTFT is compared is always
sent with the OpenAI SDK (`llmq.bench.load.one_request`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from llmq.bench.load_model import LoadSettings, RequestSample, retry_after_seconds

_DATA = b"data: "


def _content_of(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or ()
    return str((choices[0].get("delta") or {}).get("content") or "") if choices else ""


async def one_lean_request(
    session: Any,
    api_key: str,
    settings: LoadSettings,
    sample: RequestSample,
    messages: list[Any],
) -> None:
    """Send one streaming chat completion over `session` (an `aiohttp.ClientSession`) and
    fill ``sample`` in, as `one_request` does with the OpenAI SDK."""
    import aiohttp

    batch = sample.tier == "batch"
    body = {
        "model": settings.model,
        "messages": messages,
        "max_tokens": settings.batch_max_tokens if batch else settings.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tier": sample.tier,
    }
    headers = {"Authorization": f"Bearer {api_key}"}
    start = time.perf_counter()
    url = settings.base_url.rstrip("/") + "/chat/completions"
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status == 429:
                sample.status = "rate_limited"
                sample.retry_after_s = retry_after_seconds(response.headers.get("retry-after"))
                await response.read()
                return
            if response.status != 200:
                text = (await response.read())[:200].decode(errors="replace")
                sample.status, sample.error = "error", f"HTTP {response.status}: {text}"
                return
            async for line in response.content:
                if not line.startswith(_DATA) or line.startswith(b"data: [DONE]"):
                    continue
                if sample.ttft_s is None or b'"usage":{' in line or b'"usage": {' in line:
                    chunk = json.loads(line[len(_DATA) :])
                    if chunk.get("error"):  # a stream that failed after it started
                        sample.status, sample.error = "error", str(chunk["error"])[:200]
                        return
                    if sample.ttft_s is None and _content_of(chunk):
                        sample.ttft_s = time.perf_counter() - start
                    usage = chunk.get("usage")
                    if usage:
                        sample.completion_tokens = usage["completion_tokens"]
                        sample.prompt_tokens = usage["prompt_tokens"]
                        details = usage.get("prompt_tokens_details") or {}
                        sample.cached_tokens = details.get("cached_tokens") or 0
        sample.e2e_s = time.perf_counter() - start
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        sample.status, sample.error = "error", f"{type(exc).__name__}: {exc}"


def lean_session(settings: LoadSettings) -> Any:
    """An `aiohttp.ClientSession` for `one_lean_request` (close it when done)."""
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=settings.request_timeout_s),
        connector=aiohttp.TCPConnector(limit=0),
    )
