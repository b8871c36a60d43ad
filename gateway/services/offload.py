"""CPU-bound request work off the event loop: parsing large bodies, chat templates, tokenizing.

One event loop serves every stream of a gateway; a request that tokenizes a long prompt on it
would stall them all. Such work runs on a small thread pool instead (Hugging Face tokenizers and
the JSON parser release or share the GIL in short slices), so a large request costs its own
latency, not everyone's. The pool is bounded: more requests wait their turn for a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ThreadOffload:
    """Runs blocking callables on a fixed number of threads, awaiting their results."""

    def __init__(self, threads: int, name: str = "llmq-offload") -> None:
        if threads < 1:
            raise ValueError("at least one thread is needed")
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a pool thread (with this task's context variables)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


async def inline(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """The same call on the event loop itself (unit tests with trivial tokenizers)."""
    return fn(*args, **kwargs)
