"""The worker's listeners: abort running jobs as their gateways cancel them; fetch at once
when a job is announced for the pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from workers.pull_loop import PullLoop


class CancelListener(Protocol):
    def listen(self) -> AsyncIterator[str]: ...


class WakeListener(Protocol):
    def listen(self, pool: str) -> AsyncIterator[None]: ...


async def listen_for_cancels(cancels: CancelListener, loop: PullLoop) -> None:
    """Abort running jobs as their gateways cancel them."""
    async for request_id in cancels.listen():
        with contextlib.suppress(Exception):
            await loop.cancel(request_id)


async def listen_for_wakes(wakes: WakeListener, pool: str, loop: PullLoop) -> None:
    """Tell the pull loop each time a job is announced for its pool (it may be idle, its
    partitions paused)."""
    async for _ in wakes.listen(pool):
        loop.announced()
