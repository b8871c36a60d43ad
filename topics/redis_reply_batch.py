"""Worker side of the token relay: the events of one engine step go to Redis together.

An engine step produces one token for every running sequence, and every sequence's runner
publishes its event at the same moment. One Redis round trip per event made the relay the
worker's main cost (and a pub/sub message per token the gateway's). `RedisReplyBatch` collects
what the runners publish in the same turn of the event loop and sends it as one script call:
one PUBLISH per gateway channel (several events travel as one `ReplyBatchEvent`), plus the
delivered usage of each streamed job, recorded only if its gateway received the message.

Each runner still awaits its own event's result before producing the next, so one job's
events stay in order; batching changes how many round trips carry them, not what they say.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from redis.asyncio import Redis

from schemas.messages import UsageCounts, reply_batch_bytes

_PUBLISH_BATCH = """
local channels = tonumber(ARGV[1])
local reached = {}
for i = 1, channels do
  reached[i] = redis.call('PUBLISH', ARGV[2 * i], ARGV[2 * i + 1])
end
local at = 2 * channels + 2
for k = 1, #KEYS do
  if reached[tonumber(ARGV[at])] > 0 then
    redis.call('HSET', KEYS[k], 'prompt', ARGV[at + 1], 'cached', ARGV[at + 2],
      'completion', ARGV[at + 3])
  end
  at = at + 4
end
return reached
"""
"""ARGV: the number of channels, then (channel, message) pairs, then for each key (a job's
attempt hash) its channel's position and the usage to record as delivered. PUBLISH counts
the subscribers that got the message (on one Redis: llmq uses a single primary for the
relay, as a Redis Cluster would count only its own node's)."""


@dataclass
class _Pending:
    """What the runners handed over during one turn of the event loop."""

    channels: dict[str, list[bytes]] = field(default_factory=dict)
    records: list[tuple[str, str, UsageCounts]] = field(default_factory=list)
    done: asyncio.Future[dict[str, int]] | None = None


class RedisReplyBatch:
    """Coalesces reply events into one script call per event-loop turn."""

    def __init__(self, redis: Redis) -> None:
        self._publish_batch = redis.register_script(_PUBLISH_BATCH)
        self._pending: _Pending | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    async def send(
        self, channel: str, payload: bytes, record: tuple[str, UsageCounts] | None = None
    ) -> int:
        """Publish `payload` (one event's JSON) on `channel`; with `record` (an attempt key
        and usage), record that usage as delivered if a gateway received it. Returns how
        many subscribers received the message that carried it (0: nobody listens)."""
        pending = self._pending
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self._pending = _Pending(done=loop.create_future())
            flush = loop.create_task(self._flush(pending))
            self._flushes.add(flush)
            flush.add_done_callback(self._flushes.discard)
        pending.channels.setdefault(channel, []).append(payload)
        if record is not None:
            pending.records.append((record[0], channel, record[1]))
        assert pending.done is not None
        # Shielded: a runner cancelled while waiting must not cancel the others' results.
        reached = await asyncio.shield(pending.done)
        return reached[channel]

    async def _flush(self, pending: _Pending) -> None:
        assert pending.done is not None
        # One more turn: runners woken by the same engine step may still be queued behind
        # the one that opened this batch.
        await asyncio.sleep(0)
        self._pending = None
        try:
            reached = await self._send(pending)
        except asyncio.CancelledError:  # the loop is shutting down
            pending.done.cancel()
            raise
        except Exception as exc:  # every waiting runner sees the failure
            pending.done.set_exception(exc)
            pending.done.exception()  # retrieved: nobody waiting is not an error
            return
        pending.done.set_result(reached)

    async def _send(self, pending: _Pending) -> dict[str, int]:
        names = list(pending.channels)
        position = {name: i + 1 for i, name in enumerate(names)}
        args: list[bytes | str | int] = [len(names)]
        for name in names:
            args += [name, reply_batch_bytes(pending.channels[name])]
        keys = []
        for key, channel, usage in pending.records:
            keys.append(key)
            args += [
                position[channel],
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            ]
        reached = await self._publish_batch(keys=keys, args=args)
        return {name: int(count) for name, count in zip(names, reached, strict=True)}
