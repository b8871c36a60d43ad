"""Waiting on state that lives in another process (a broker's committed offset, a heartbeat).

Such state has no event to await, so it is polled at a short interval under a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    within: float,
    interval: float = 0.05,
) -> T:
    """The first value of `probe()` that `accept`s, or TimeoutError with the last value seen."""
    deadline = time.monotonic() + within
    value = await probe()
    for _ in iter(int, 1):
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"still {value!r} after {within}s")
        await asyncio.sleep(interval)
        value = await probe()
    raise AssertionError("unreachable")
