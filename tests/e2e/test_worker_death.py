"""SIGKILL of the real worker mid-load: each caller's outcome follows what it had seen.

A stream that had sent tokens ends with an SSE error event `stream_interrupted` carrying the
partial usage, then `[DONE]`; a non-streaming request whose caller had seen nothing is re-run
on the restarted worker and answered whole. Each request is billed exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from schemas.messages import UsageRecord
from tests.e2e.conftest import Stack
from tests.topic_reading import read_until
from topics import catalog

pytestmark = pytest.mark.e2e

ATTEMPTS = 3
"""The random model may end its answer (EOS) before the kill; such an attempt proves nothing
about interruption, so the scenario runs again with another seed."""


async def _first_tokens_then_rest(
    http: httpx.AsyncClient, stack: Stack, seed: int, seen: asyncio.Event
) -> tuple[int, list[dict[str, object]]]:
    """Stream one request; set `seen` after 3 content chunks; return (content chunks, every
    event after the first 3)."""
    body = {
        "model": stack.model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 1500,
        "seed": seed,
        "stream": True,
    }
    chunks = 0
    rest: list[dict[str, object]] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                rest.append({"done": True})
                break
            event = json.loads(data)
            if chunks >= 3:
                rest.append(event)
            choices = event.get("choices") or []
            if choices and choices[0]["delta"].get("content"):
                chunks += 1
                if chunks == 3:
                    seen.set()
    return chunks, rest


async def test_sigkill_mid_stream_interrupts_the_stream_and_reruns_the_unseen(
    stack: Stack,
) -> None:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    sdk = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=300
    )
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=300) as http:
        for seed in range(ATTEMPTS):
            t0 = time.time()
            seen = asyncio.Event()
            streaming = asyncio.create_task(_first_tokens_then_rest(http, stack, seed, seen))
            await asyncio.wait_for(seen.wait(), 120)
            quiet = asyncio.create_task(
                sdk.chat.completions.create(
                    model=stack.model,
                    messages=[{"role": "user", "content": "Say hello."}],
                    max_tokens=64,
                    seed=seed,
                )
            )
            await asyncio.sleep(0.3)  # let the non-streaming job reach the worker (not a sync)
            stack.processes.kill("worker")  # no drain, no goodbye: its engine dies with it
            stack.processes.restart("worker")
            chunks, rest = await asyncio.wait_for(streaming, 300)
            completion = await asyncio.wait_for(quiet, 300)
            errors = [e for e in rest if "error" in e]
            if not errors:  # the story ended before the kill: nothing was interrupted
                continue
            (error,) = errors
            assert error["error"]["code"] == "stream_interrupted"  # type: ignore[index]
            usage = error["usage"]
            assert isinstance(usage, dict)
            assert usage["completion_tokens"] >= chunks >= 3  # what the caller saw, billed
            assert rest[-1] == {"done": True}  # then [DONE]: the stream ends cleanly

            # The non-streaming caller saw nothing before the kill: it got a whole answer.
            assert completion.choices[0].finish_reason in ("stop", "length")
            assert completion.usage is not None and completion.usage.completion_tokens > 0

            ids = {completion.id}
            records = await read_until(
                stack.kafka_bootstrap,
                catalog.USAGE_TOPIC,
                UsageRecord.model_validate_json,
                lambda u, since=t0: u.finished_at > since and u.team == "e2e",  # type: ignore[misc]
                at_least=2,
            )
            interrupted = [r for r in records if r.finish_reason == "interrupted"]
            assert len(interrupted) == 1
            assert interrupted[0].completion_tokens == usage["completion_tokens"]
            assert [r.request_id for r in records if r.request_id in ids] == [completion.id]
            break
        else:
            pytest.fail(f"every one of {ATTEMPTS} stories ended before the worker was killed")
    await sdk.close()
    stack.wait_ready()
