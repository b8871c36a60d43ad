"""The worker's side of the relay on a real Valkey: the events runners hand over together
travel as one message per gateway channel, one batch at a time and in the order handed over,
and a streamed job's usage is recorded as delivered only when its gateway received it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from schemas.messages import ReplyBatchEvent, TokenEvent, relay_message_adapter
from topics.ports import Delivered
from topics.redis_reply_batch import RedisReplyBatch

pytestmark = pytest.mark.integration


async def _next_data(pubsub: PubSub, within_s: float) -> bytes | None:
    """The next published message's data (skipping the subscription's confirmation)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within_s
    while (left := until - loop.time()) > 0:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if message is not None:
            return bytes(message["data"])
    return None


def _token(request_id: str, seq: int = 0) -> bytes:
    return TokenEvent(request_id=request_id, seq=seq, text="t", num_tokens=1).to_bytes()


async def test_one_message_per_channel_and_usage_recorded_only_where_received(
    redis: Redis,
) -> None:
    run = uuid.uuid4().hex[:8]
    listened, unheard = f"llmq:reply:{run}-a", f"llmq:reply:{run}-nobody"
    pubsub = redis.pubsub()
    await pubsub.subscribe(listened)
    batch = RedisReplyBatch(redis)

    def usage(key: str) -> Delivered:
        return Delivered(f"{run}:{key}", prompt_tokens=5, cached_tokens=1, completion_tokens=2)

    try:
        reached = await asyncio.gather(
            batch.send(listened, _token("r1"), usage("r1")),
            batch.send(listened, _token("r2"), usage("r2")),
            batch.send(listened, _token("r3")),
            batch.send(unheard, _token("r4"), usage("r4")),
        )
        assert list(reached) == [1, 1, 1, 0]
        message = await _next_data(pubsub, 5)
        assert message is not None
        relayed = relay_message_adapter.validate_json(message)
        assert isinstance(relayed, ReplyBatchEvent)
        assert [e.request_id for e in relayed.events] == ["r1", "r2", "r3"]
        assert await _next_data(pubsub, 0.2) is None  # one message, not three
        assert await redis.hgetall(f"{run}:r1") == {
            b"prompt": b"5",
            b"cached": b"1",
            b"completion": b"2",
        }
        assert await redis.exists(f"{run}:r4") == 0  # nobody received it: nothing delivered

        # A send on its own (the next engine step) goes out bare, as one event.
        assert await batch.send(listened, _token("r1"), usage("r1")) == 1
        single = await _next_data(pubsub, 5)
        assert single is not None
        assert isinstance(relay_message_adapter.validate_json(single), TokenEvent)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]


async def test_batches_go_one_at_a_time_and_keep_the_order_events_were_handed_over(
    redis: Redis,
) -> None:
    channel = f"llmq:reply:{uuid.uuid4().hex[:8]}"
    pubsub = redis.pubsub()
    await pubsub.subscribe(channel)
    batch = RedisReplyBatch(redis)
    answers: list[asyncio.Future[dict[str, int]]] = []
    try:
        for seq in range(60):  # runners handing over tokens while earlier batches are out
            answers.append(batch.push(channel, _token("r", seq)))
            if seq % 7 == 0:
                await asyncio.sleep(0)  # let the event loop turn (a runner awaiting its engine)
        results = await asyncio.wait_for(asyncio.gather(*answers), 10)
        assert all(result[channel] == 1 for result in results)
        batches = list(dict.fromkeys(map(id, answers)))
        assert len(batches) > 1  # several script calls, not one
        relayed: list[int] = []
        while len(relayed) < 60:
            data = await _next_data(pubsub, 5)
            assert data is not None, f"only {len(relayed)} of 60 events arrived"
            message = relay_message_adapter.validate_json(data)
            events = message.events if isinstance(message, ReplyBatchEvent) else (message,)
            relayed += [e.seq for e in events if isinstance(e, TokenEvent)]
        assert relayed == list(range(60))
        assert await _next_data(pubsub, 0.2) is None  # each event exactly once
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
