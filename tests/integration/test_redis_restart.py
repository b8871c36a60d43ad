"""A Redis restart under the token relay and the cancel listener: streams it cut end with an
error event, new requests are refused (503) only until the relay has resubscribed, and both
come back by themselves. A Valkey of its own, restarted on the same port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmq import services, starters
from schemas.messages import CancelEvent, ErrorEvent, TokenEvent
from tests.polling import eventually
from topics.redis_client import connect_redis
from topics.redis_relay import RedisCancelBus, RedisEventPublisher, RedisReplyRelay

pytestmark = pytest.mark.integration


class RestartableValkey:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = services.free_port()
        self.starts = 0
        self.proc = self._start()

    def _start(self) -> services.ManagedProcess:
        self.starts += 1
        log_path = self.folder / f"valkey-{self.starts}.log"
        return starters.start_valkey(self.port, log_path, data_dir=self.folder)

    def kill(self) -> None:
        services.stop(self.proc)

    def start_again(self) -> None:
        self.proc = self._start()


@pytest.fixture
async def valkey(tmp_path: Path) -> AsyncIterator[RestartableValkey]:
    server = RestartableValkey(tmp_path)
    yield server
    services.stop(server.proc)


async def test_relay_and_cancel_listener_survive_a_redis_restart(
    valkey: RestartableValkey,
) -> None:
    port = valkey.port
    url = f"redis://{services.LOCALHOST}:{port}/0"
    redis = connect_redis(url)  # as every llmq process connects: commands retry
    relay = RedisReplyRelay(redis, "restart-test", retry_s=0.1)
    await relay.start()
    cancels_seen: list[str] = []

    async def listen() -> None:
        async for request_id in RedisCancelBus(redis).listen(retry_s=0.1):
            cancels_seen.append(request_id)

    listener = asyncio.create_task(listen())
    try:
        cut = relay.open("cut-by-restart")
        valkey.kill()
        event = await asyncio.wait_for(cut.next_event(), 10)
        assert isinstance(event, ErrorEvent) and event.code == "stream_interrupted"
        assert not relay.connected
        valkey.start_again()  # a fresh, empty Valkey on the same port
        await eventually(lambda: _value(relay.connected), lambda ok: ok, within=10)

        fresh = relay.open("after-restart")
        await RedisEventPublisher(redis).publish(
            relay.channel, TokenEvent(request_id="after-restart", seq=0, text="hi", num_tokens=1)
        )
        got = await asyncio.wait_for(fresh.next_event(), 10)
        assert isinstance(got, TokenEvent) and got.text == "hi"

        async def cancel_seen() -> bool:
            await RedisCancelBus(redis).cancel(CancelEvent(request_id="cancel-after-restart"))
            return "cancel-after-restart" in cancels_seen

        await eventually(cancel_seen, lambda seen: seen, within=10, interval=0.1)
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await relay.stop()
        await redis.aclose()


async def _value(value: bool) -> bool:
    return value
