"""Worker side of the token relay: events travel to Redis in batches, one batch at a time.

An engine step produces one token for every running sequence. One Redis round trip per event
made the relay the worker's main cost (and a pub/sub message per token the gateway's).
`RedisReplyBatch` collects what the runners hand over and sends it as one script call: one
PUBLISH per gateway channel (several events travel as one `ReplyBatchEvent`), plus the
delivered usage of each streamed job, recorded only if its gateway received the message.

One batch is in flight at a time. What is handed over meanwhile waits for the next one, so
events reach Redis in the order they were handed over (a job's tokens, then its finish), and
a slow Redis makes batches larger rather than round trips more numerous. A runner need not
wait for its event: `push` returns the future of the batch that carries it, and the runner
reads it when it comes back (``send`` waits for it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from redis.asyncio import Redis

from schemas.messages import reply_batch_bytes
from topics.ports import Delivered

_PUBLISH_BATCH = """
local channels = tonumber(ARGV[1])
local reached = {}
for i = 1, channels do
  reached[i] = redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1])
end
local k = 0
for position, prompt, cached, completion in
    string.gmatch(ARGV[2 * channels + 2], '(%d+) (%d+) (%d+) (%d+)') do
  k = k + 1
  if reached[tonumber(position)] > 0 then
    redis.call('HSET', KEYS[k], 'prompt', prompt, 'cached', cached, 'completion', completion)
  end
end
return reached
"""
"""ARGV: the number of channels, then (channel, message) pairs, then one string with, for
each key (a job's attempt hash, in order), its channel's position and the usage to record as
delivered: four numbers. PUBLISH counts the subscribers that got the message (on one Redis:
llmq uses a single primary for the relay, as a Redis Cluster would count only its own node's).
"""


@dataclass
class _Batch:
    """What the runners handed over for one script call."""

    done: asyncio.Future[dict[str, int]]
    channels: dict[str, list[bytes]] = field(default_factory=dict)
    records: list[tuple[str, Delivered]] = field(default_factory=list)


class RedisReplyBatch:
    """Coalesces reply events into one script call at a time (see the module docstring)."""

    def __init__(self, redis: Redis) -> None:
        self._publish_batch = redis.register_script(_PUBLISH_BATCH)
        self._next: _Batch | None = None
        self._sender: asyncio.Task[None] | None = None

    def push(
        self, channel: str, payload: bytes, delivered: Delivered | None = None
    ) -> asyncio.Future[dict[str, int]]:
        """Hand over `payload` (one event's JSON) for `channel`; with `delivered`, record that
        usage as delivered if a gateway receives it. Returns the future of the batch carrying
        it: subscribers reached per channel (0: nobody listens), or the send's exception."""
        batch = self._next
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._next = _Batch(loop.create_future())
            if self._sender is None:
                self._sender = loop.create_task(self._send_batches(), name="reply-batch")
        batch.channels.setdefault(channel, []).append(payload)
        if delivered is not None:
            batch.records.append((channel, delivered))
        return batch.done

    async def send(self, channel: str, payload: bytes, delivered: Delivered | None = None) -> int:
        """`push`, then wait: how many subscribers received the message that carried it."""
        done = self.push(channel, payload, delivered)
        # Shielded: a runner cancelled while waiting must not cancel the others' results.
        reached = await asyncio.shield(done)
        return reached[channel]

    async def _send_batches(self) -> None:
        """Send batches one after another until none is waiting."""
        try:
            while True:
                # One more turn: runners woken by the same engine step may still be queued
                # behind the one that opened this batch.
                await asyncio.sleep(0)
                batch, self._next = self._next, None
                if batch is None:
                    return
                try:
                    reached = await self._send(batch)
                except asyncio.CancelledError:  # the loop is shutting down
                    batch.done.cancel()
                    raise
                except Exception as exc:  # every runner in the batch sees the failure
                    if not batch.done.done():
                        batch.done.set_exception(exc)
                        batch.done.exception()  # retrieved: nobody waiting is not an error
                else:
                    if not batch.done.done():
                        batch.done.set_result(reached)
        finally:
            self._sender = None

    async def _send(self, batch: _Batch) -> dict[str, int]:
        names = list(batch.channels)
        position = {name: i + 1 for i, name in enumerate(names)}
        args: list[bytes | str | int] = [len(names)]
        for name in names:
            args += [name, reply_batch_bytes(batch.channels[name])]
        args.append(
            " ".join(
                f"{position[channel]} {d.prompt_tokens} {d.cached_tokens} {d.completion_tokens}"
                for channel, d in batch.records
            )
        )
        keys = [d.attempt_key for _, d in batch.records]
        reached = await self._publish_batch(keys=keys, args=args)
        return {name: int(count) for name, count in zip(names, reached, strict=True)}
