"""Honest streaming: the first server-sent `data:` event goes out with the first generated
token, never before. Checked against the worker's own record of when the engine produced that
token (`TokenEvent.generated_at`, read off the reply channel), not a wall-clock threshold,
for chat completions and completions alike."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from schemas.messages import ReplyBatchEvent, TokenEvent, relay_message_adapter
from tests.e2e.conftest import API_KEY, Stack

pytestmark = pytest.mark.e2e

LONG = "Tell me everything about the history of sea shipping. " * 40


async def _first_token_event(
    redis: Redis, request_id: asyncio.Future[str], subscribed: asyncio.Event
) -> TokenEvent:
    """The first token event of the request whose id `request_id` resolves to, as published
    by the worker on a gateway's reply channel."""
    pubsub = redis.pubsub()
    await pubsub.psubscribe("llmq:reply:*")
    subscribed.set()
    seen: list[TokenEvent] = []
    try:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                relayed = relay_message_adapter.validate_json(message["data"])
                batch = relayed.events if isinstance(relayed, ReplyBatchEvent) else (relayed,)
                for event in batch:
                    if isinstance(event, TokenEvent) and event.num_tokens > 0:
                        seen.append(event)
            if request_id.done():
                for event in seen:
                    if event.request_id == request_id.result():
                        return event
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def _stream(
    stack: Stack, path: str, body: dict[str, Any], request_id: asyncio.Future[str]
) -> tuple[float, dict[str, Any]]:
    """(when the first `data:` event arrived, its payload)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
        async with http.stream("POST", path, json=body, headers=headers) as response:
            assert response.status_code == 200
            request_id.set_result(response.headers["x-request-id"])
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    return time.time(), json.loads(line.removeprefix("data:"))
    raise AssertionError("no data event")


@pytest.mark.parametrize(
    ("path", "body", "text_of"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": LONG}]},
            lambda chunk: chunk["choices"][0]["delta"]["content"],
        ),
        ("/v1/completions", {"prompt": LONG}, lambda chunk: chunk["choices"][0]["text"]),
    ],
)
async def test_the_first_data_event_carries_the_first_token_and_never_precedes_it(
    stack: Stack, path: str, body: dict[str, Any], text_of: Any
) -> None:
    redis = Redis.from_url(stack.redis_url)
    try:
        request_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        subscribed = asyncio.Event()
        listener = asyncio.create_task(_first_token_event(redis, request_id, subscribed))
        await subscribed.wait()  # listening before the request exists
        payload = {"model": stack.model, "max_tokens": 4, "stream": True, **body}
        arrived, first = await _stream(stack, path, payload, request_id)
        token = await asyncio.wait_for(listener, 30)
    finally:
        await redis.aclose()
    assert text_of(first), "the first event carries generated text"
    assert token.generated_at is not None
    assert arrived >= token.generated_at
