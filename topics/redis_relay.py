"""Redis adapters: the token relay (pub/sub), cancels, and replica heartbeats.

The relay follows encode/broadcaster's shape: one pub/sub connection per gateway process,
subscribed to that gateway's reply channel once at start-up, demultiplexed to per-request
queues. Because the subscription exists before any job is produced, no event can be missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import structlog
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import CancelEvent, ErrorEvent, ReplyBatchEvent, relay_message_adapter
from topics import catalog
from topics.ports import Delivered, ReplyEventT
from topics.redis_client import channel_messages
from topics.redis_reply_batch import RedisReplyBatch

log = structlog.get_logger()


class _RequestEvents:
    """The queue of one request's events."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[ReplyEventT] = asyncio.Queue()
        self.interrupted = False
        self._deadline: asyncio.TimerHandle | None = None

    def end_at(self, deadline: float, event: ReplyEventT) -> None:
        """Queue `event` at `deadline` (Unix time) unless the request is closed first: one
        timer per request, where a timeout around every wait cost a timer per token."""
        delay = max(deadline - time.time(), 0.0)
        self._deadline = asyncio.get_running_loop().call_later(delay, self.queue.put_nowait, event)

    def closed(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()

    async def next_event(self) -> ReplyEventT:
        return await self.queue.get()

    async def __aiter__(self) -> AsyncIterator[ReplyEventT]:
        while True:
            yield await self.queue.get()


class RedisReplyRelay:
    """Gateway side: one subscription to ``llmq:reply:<gateway-id>``, events routed by id."""

    def __init__(self, redis: Redis, gateway_id: str, retry_s: float = 0.5) -> None:
        self._redis = redis
        self.channel = catalog.reply_channel(gateway_id)
        self._requests: dict[str, _RequestEvents] = {}
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._retry_s = retry_s
        self.connected = False
        """Whether the subscription is live: a job produced while it is not would stream into
        the void, so the gateway refuses new requests (503) until it is back."""
        self.disconnects = 0
        """Times the subscription was lost (each followed by a resubscription attempt)."""

    async def start(self) -> None:
        await self._subscribe()
        self._reader = asyncio.create_task(self._read_forever(), name="reply-relay")

    async def _subscribe(self) -> None:
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(self.channel)
        self.connected = True
        log.info("relay_subscribed", channel=self.channel)

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2

    def open(self, request_id: str) -> _RequestEvents:
        events = _RequestEvents(request_id)
        self._requests[request_id] = events
        return events

    def close(self, request_id: str) -> None:
        events = self._requests.pop(request_id, None)
        if events is not None:
            events.closed()

    @property
    def open_requests(self) -> int:
        return len(self._requests)

    def deliver(self, raw: bytes | str) -> bool:
        """Route one raw message (an event, or a batch of them) to its requests' queues;
        False if nobody waits for any of them."""
        try:
            message = relay_message_adapter.validate_json(raw)
        except ValidationError:
            log.warning("reply_event_rejected", size=len(raw))
            return False
        batch = message.events if isinstance(message, ReplyBatchEvent) else (message,)
        delivered = False
        for event in batch:
            events = self._requests.get(event.request_id)
            if events is not None:
                events.queue.put_nowait(event)
                delivered = True
        return delivered

    async def _read_forever(self) -> None:
        """Deliver messages; when Redis goes away, end the streams it cut and resubscribe."""
        while True:
            try:
                if self._pubsub is None or not self.connected:
                    await self._subscribe()
                assert self._pubsub is not None
                async for message in self._pubsub.listen():
                    if message.get("type") == "message":
                        self.deliver(message["data"])
            except (RedisError, OSError) as exc:
                if self.connected:
                    self.connected = False
                    self.disconnects += 1
                    log.warning("relay_disconnected", error=type(exc).__name__)
                    self._interrupt_open_requests()
                if self._pubsub is not None:
                    with contextlib.suppress(RedisError, OSError):
                        await self._pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
                    self._pubsub = None
                await asyncio.sleep(self._retry_s)

    def _interrupt_open_requests(self) -> None:
        """Events published while the subscription was down are lost: end those streams."""
        for events in list(self._requests.values()):
            events.interrupted = True
            events.queue.put_nowait(
                ErrorEvent(
                    request_id=events.request_id,
                    code="stream_interrupted",
                    message="The token relay was interrupted (Redis restarted); retry the request.",
                )
            )


class RedisEventPublisher:
    """Worker side of the relay: events to the requesting gateways' channels, batched with
    the other events handed over meanwhile (`RedisReplyBatch`), in the order handed over."""

    def __init__(self, redis: Redis) -> None:
        self._batch = RedisReplyBatch(redis)

    async def publish(self, channel: str, event: ReplyEventT) -> int:
        return await self._batch.send(channel, event.to_bytes())

    def push(
        self, channel: str, payload: bytes, delivered: Delivered | None = None
    ) -> asyncio.Future[dict[str, int]]:
        return self._batch.push(channel, payload, delivered)


class RedisCancelBus:
    """Cancels: a key with a TTL (for jobs still queued) plus a broadcast (for running ones)."""

    def __init__(self, redis: Redis, ttl_s: int = 3600) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def cancel(self, event: CancelEvent) -> None:
        await self._redis.set(catalog.cancel_key(event.request_id), b"1", ex=self._ttl_s)
        await self._redis.publish(catalog.CANCEL_CHANNEL, event.to_bytes())

    async def is_cancelled(self, request_id: str) -> bool:
        return bool(await self._redis.exists(catalog.cancel_key(request_id)))

    async def is_batch_cancelled(self, batch_id: str) -> bool:
        return bool(await self._redis.exists(catalog.batch_cancel_key(batch_id)))

    async def listen(self, retry_s: float = 0.5) -> AsyncIterator[str]:
        """Request ids as they are cancelled (workers run this for the life of the process).

        Survives Redis restarts by subscribing again; a cancel broadcast while it was away is
        still found through its key when the job starts (`is_cancelled`)."""
        cancels = channel_messages(
            self._redis, catalog.CANCEL_CHANNEL, "cancel_listener_disconnected", retry_s
        )
        async for data in cancels:
            if data is None:
                continue  # (re)subscribed
            try:
                yield CancelEvent.model_validate_json(data).request_id
            except ValidationError:
                log.warning("cancel_event_rejected")


class RedisJobLedger:
    """Finished request ids, remembered for `ttl_s` so redeliveries and replays are skipped."""

    def __init__(self, redis: Redis, ttl_s: int = 7 * 86_400) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def is_finished(self, request_id: str) -> bool:
        return bool(await self._redis.exists(catalog.done_key(request_id)))

    async def mark_finished(self, request_id: str) -> bool:
        first = await self._redis.set(catalog.done_key(request_id), b"1", ex=self._ttl_s, nx=True)
        return bool(first)


class RedisReplicaDirectory:
    """Heartbeats as Redis keys with a TTL (a replica that stops beating disappears), listed
    in a sorted set (`catalog.REPLICA_INDEX_KEY`): finding them costs two round trips however
    many keys Redis holds (a SCAN walked every job's keys, twice a second per gateway)."""

    def __init__(self, redis: Redis, ttl_ms: int = 3000) -> None:
        self._redis = redis
        self._ttl_ms = ttl_ms

    async def beat(self, heartbeat: ReplicaHeartbeat) -> None:
        expires_ms = int(time.time() * 1000) + self._ttl_ms
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(
                catalog.replica_key(heartbeat.replica_id), heartbeat.to_bytes(), px=self._ttl_ms
            )
            pipe.zadd(catalog.REPLICA_INDEX_KEY, {heartbeat.replica_id: expires_ms})
            await pipe.execute()

    async def remove(self, replica_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(catalog.replica_key(replica_id))
            pipe.zrem(catalog.REPLICA_INDEX_KEY, replica_id)
            await pipe.execute()

    async def replicas(self) -> list[ReplicaHeartbeat]:
        # Ids whose heartbeat expired a minute ago are dropped from the index (a minute: the
        # clocks of workers and gateways may differ; the keys' TTLs decide who is alive).
        stale_ms = int(time.time() * 1000) - 60_000
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(catalog.REPLICA_INDEX_KEY, "-inf", stale_ms)
            pipe.zrange(catalog.REPLICA_INDEX_KEY, 0, -1)
            _, ids = await pipe.execute()
        if not ids:
            return []
        found: list[ReplicaHeartbeat] = []
        keys = [catalog.replica_key(i.decode() if isinstance(i, bytes) else i) for i in ids]
        for raw in await self._redis.mget(keys):
            if raw is None:
                continue
            try:
                found.append(ReplicaHeartbeat.model_validate_json(raw))
            except ValidationError:
                log.warning("heartbeat_rejected", size=len(raw))
        return found
