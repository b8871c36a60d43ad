"""Admission control and team quotas on the whole stack, seen through the HTTP API."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from redis.asyncio import Redis

from tests.e2e.conftest import SMALL_TEAM_KEY, STRICT_MODEL, TEAM_KEYS, Stack
from topics.catalog import team_backlogs_key

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello."}]


async def test_overload_is_refused_with_retry_after_before_any_stream(stack: Stack) -> None:
    # 40 streams at once on a pool with 8 sequence slots: jobs queue up, and the strict
    # deployment's SLO cannot be met by any request that finds a queue ahead of it.
    body = {"model": STRICT_MODEL, "messages": HELLO, "max_tokens": 64, "stream": True}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=120) as http:

        async def one() -> httpx.Response:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                await response.aread()
                return response

        responses = await asyncio.gather(*(one() for _ in range(40)))
    refused = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert refused and served, [r.status_code for r in responses]
    assert len(refused) + len(served) == 40
    for response in refused:
        assert response.headers["content-type"].startswith("application/json")  # no SSE
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "overloaded" and error["type"] == "rate_limit_error"
    for response in served:
        assert response.text.rstrip().endswith("data: [DONE]")


async def test_over_quota_team_is_refused_while_another_team_is_served(stack: Stack) -> None:
    small = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=SMALL_TEAM_KEY, max_retries=0
    )
    other = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0
    )
    # The first request reserves most of the small team's 200 tokens per minute until its
    # usage is reconciled, which cannot happen before it ends: keep it open.
    first = await small.chat.completions.create(
        model=stack.model,
        messages=HELLO,
        max_tokens=150,
        stream=True,  # type: ignore[arg-type]
    )
    await anext(aiter(first))
    with pytest.raises(openai.RateLimitError) as info:
        await small.chat.completions.create(
            model=stack.model,
            messages=HELLO,
            max_tokens=150,  # type: ignore[arg-type]
        )
    assert info.value.code == "rate_limit_exceeded"
    assert int(info.value.response.headers["retry-after"]) >= 1
    served = await other.chat.completions.create(
        model=stack.model,
        messages=HELLO,
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert served.choices[0].message.content is not None
    async for _ in first:
        pass
    too_big = small.chat.completions.create(
        model=stack.model,
        messages=HELLO,
        max_tokens=1000,  # type: ignore[arg-type]
    )
    with pytest.raises(openai.RateLimitError) as never:
        await too_big
    assert "more than your team's quota" in never.value.message
    await small.close()
    await other.close()


async def test_a_finished_request_holds_no_slot_when_its_caller_hears_the_end(
    stack: Stack,
) -> None:
    """Admission counts a running job's share of slot time until it ends. A client that sends
    its next request the moment the last one ended must not find that one still counted
    ahead of it: on a pool whose calibration is off, that alone refused an idle pool's
    requests."""
    client = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key=TEAM_KEYS["team-a"], max_retries=0
    )
    redis = Redis.from_url(stack.redis_url)
    try:
        for stream in (False, True, False, True):
            if stream:
                chunks = await client.chat.completions.create(
                    model=stack.model, messages=HELLO, max_tokens=4, stream=True
                )
                async for _ in chunks:
                    pass
            else:
                await client.chat.completions.create(
                    model=stack.model, messages=HELLO, max_tokens=4
                )
            held = await redis.hget(team_backlogs_key(stack.pool, "interactive"), "team-a")
            assert held is None, f"a finished job still holds {held!r} units"
    finally:
        await client.close()
        await redis.aclose()
