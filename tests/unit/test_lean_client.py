"""The load benchmark's lean flood client fills a sample as the OpenAI SDK's path does: TTFT at
the first content token, usage from the last chunk, 429s with their Retry-After, and a stream
that fails after it started. Served by a scripted aiohttp app on a loopback port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmq.bench.lean_client import lean_session, one_lean_request
from llmq.bench.load_model import LoadSettings, RequestSample

USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}


def _chunk(content: str | None = None, **extra: Any) -> bytes:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    return b"data: " + json.dumps({"choices": choices, **extra}).encode() + b"\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert request.headers["Authorization"] == "Bearer sk-test"
    question = body["messages"][0]["content"]
    if question == "busy":
        return web.json_response({"error": {"message": "busy"}}, status=429,
                                 headers={"Retry-After": "3"})  # fmt: skip
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_chunk(""))  # a role-only first chunk is no token yet
    await response.write(_chunk("Hel"))
    if question == "fail":
        await response.write(b'data: {"error": {"message": "engine died"}, "usage": {}}\n\n')
        return response
    await response.write(_chunk("lo"))
    await response.write(_chunk(None, usage=USAGE))
    await response.write(b"data: [DONE]\n\n")
    return response


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    async with TestServer(app, host="127.0.0.1") as running:
        yield running


async def _send(server: TestServer, question: str) -> RequestSample:
    settings = LoadSettings(base_url=str(server.make_url("/v1")))
    sample = RequestSample(tier="interactive", team="dev", stream="s", start_s=0.0)
    async with lean_session(settings) as session:
        messages = [{"role": "user", "content": question}]
        await one_lean_request(session, "sk-test", settings, sample, messages)
    return sample


async def test_a_stream_is_timed_at_its_first_token_and_counted_from_its_usage(
    server: TestServer,
) -> None:
    sample = await _send(server, "hello")
    assert sample.status == "ok" and sample.error is None
    assert sample.ttft_s is not None and sample.e2e_s is not None
    assert 0 < sample.ttft_s <= sample.e2e_s
    assert (sample.prompt_tokens, sample.completion_tokens, sample.cached_tokens) == (7, 2, 4)


async def test_a_429_and_a_failed_stream(server: TestServer) -> None:
    busy = await _send(server, "busy")
    assert (busy.status, busy.retry_after_s, busy.ttft_s) == ("rate_limited", 3.0, None)
    failed = await _send(server, "fail")
    assert failed.status == "error" and "engine died" in (failed.error or "")
    assert failed.e2e_s is None
