"""The worker's cancel listener: abort running jobs as their gateways cancel them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from workers.pull_loop import PullLoop


class CancelListener(Protocol):
    def listen(self) -> AsyncIterator[str]: ...


async def listen_for_cancels(cancels: CancelListener, loop: PullLoop) -> None:
    """Abort running jobs as their gateways cancel them."""
    async for request_id in cancels.listen():
        with contextlib.suppress(Exception):
            await loop.cancel(request_id)
