"""The reply relay's demultiplexing: each event reaches exactly its own request."""

from __future__ import annotations

import asyncio

from schemas.messages import ErrorEvent, FinishEvent, TokenEvent, UsageCounts
from topics.redis_relay import RedisReplyRelay


def _relay() -> RedisReplyRelay:
    return RedisReplyRelay(redis=None, gateway_id="g1")  # type: ignore[arg-type]  # never connects


async def test_events_reach_their_own_request_in_order() -> None:
    relay = _relay()
    a, b = relay.open("a"), relay.open("b")
    assert relay.deliver(TokenEvent(request_id="a", seq=0, text="x", num_tokens=1).to_bytes())
    assert relay.deliver(TokenEvent(request_id="b", seq=0, text="y", num_tokens=1).to_bytes())
    assert relay.deliver(
        FinishEvent(request_id="a", finish_reason="stop", usage=UsageCounts()).to_bytes()
    )
    first = await asyncio.wait_for(a.next_event(), 1)
    second = await asyncio.wait_for(a.next_event(), 1)
    assert isinstance(first, TokenEvent) and first.text == "x"
    assert isinstance(second, FinishEvent)
    only_b = await asyncio.wait_for(b.next_event(), 1)
    assert isinstance(only_b, TokenEvent) and only_b.text == "y"
    assert b.queue.empty()


async def test_unknown_closed_and_malformed_events_are_dropped() -> None:
    relay = _relay()
    relay.open("a")
    relay.close("a")
    assert relay.open_requests == 0
    assert not relay.deliver(ErrorEvent(request_id="a", code="c", message="m").to_bytes())
    assert not relay.deliver(b"not json")
    assert not relay.deliver(b'{"type": "token"}')


def test_channel_is_named_after_the_gateway() -> None:
    assert _relay().channel == "llmq:reply:g1"
