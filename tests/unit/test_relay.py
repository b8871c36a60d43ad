"""The reply relay's demultiplexing: each event reaches exactly its own request."""

from __future__ import annotations

import asyncio
import time

from schemas.messages import (
    ErrorEvent,
    FinishEvent,
    ReplyBatchEvent,
    TokenEvent,
    UsageCounts,
    relay_message_adapter,
    reply_batch_bytes,
    token_event_bytes,
)
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


async def test_a_batch_of_events_reaches_each_request_in_order() -> None:
    relay = _relay()
    a, b = relay.open("a"), relay.open("b")
    raw = reply_batch_bytes(
        [
            TokenEvent(request_id="a", seq=0, text="x", num_tokens=1).to_bytes(),
            TokenEvent(request_id="gone", seq=0, text="?", num_tokens=1).to_bytes(),
            TokenEvent(request_id="b", seq=0, text="y", num_tokens=1).to_bytes(),
            FinishEvent(request_id="a", finish_reason="stop", usage=UsageCounts()).to_bytes(),
        ]
    )
    assert relay.deliver(raw)
    assert [type(e).__name__ for e in (a.queue.get_nowait(), a.queue.get_nowait())] == [
        "TokenEvent",
        "FinishEvent",
    ]
    only_b = b.queue.get_nowait()
    assert isinstance(only_b, TokenEvent) and only_b.text == "y" and b.queue.empty()
    relay.close("a")
    relay.close("b")
    assert not relay.deliver(raw)  # nobody waits for any of them


def test_batch_bytes_are_a_valid_batch_message_and_one_event_travels_bare() -> None:
    events = [TokenEvent(request_id=f"r{i}", seq=i, text='é\n"', num_tokens=1) for i in range(3)]
    parsed = relay_message_adapter.validate_json(reply_batch_bytes([e.to_bytes() for e in events]))
    assert parsed == ReplyBatchEvent(events=tuple(events))
    assert reply_batch_bytes([events[0].to_bytes()]) == events[0].to_bytes()


def test_token_json_built_directly_reads_back_as_the_model_would_write_it() -> None:
    request_id, text, generated_at = 'chat"cmpl\\-é', 'é\n"\t\u2028 \U0001f600', 1796410599.6333253
    direct = token_event_bytes(request_id, 7, text, 2, 3, 1, generated_at)
    model = TokenEvent(
        request_id=request_id, seq=7, text=text, num_tokens=2, attempt=3, index=1,
        generated_at=generated_at,
    )  # fmt: skip
    assert relay_message_adapter.validate_json(direct) == model
    assert relay_message_adapter.validate_json(model.to_bytes()) == model


async def test_the_deadline_event_arrives_unless_the_request_closes_first() -> None:
    relay = _relay()
    late, closed = relay.open("late"), relay.open("closed")
    timeout = ErrorEvent(request_id="late", code="timeout", message="m")
    late.end_at(time.time() + 0.05, timeout)
    closed.end_at(time.time(), ErrorEvent(request_id="closed", code="timeout", message="m"))
    relay.close("closed")
    assert await asyncio.wait_for(late.next_event(), 5) == timeout
    await asyncio.sleep(0)  # the cancelled timer would have fired by now
    assert closed.queue.empty()
