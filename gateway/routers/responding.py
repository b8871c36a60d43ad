"""What the generation routers share: server-sent events, and cancelling a buffered request
whose caller disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from schemas.errors import error_body
from schemas.messages import ErrorEvent

T = TypeVar("T")


async def sse(items: AsyncIterator[BaseModel | str | ErrorEvent]) -> AsyncIterator[str]:
    """Each item as one `data:` event (a `str` is JSON already rendered), then
    `data: [DONE]`; an `ErrorEvent` goes out in OpenAI's error body (with the usage delivered
    so far) and ends the stream."""
    async for item in items:
        if isinstance(item, str):
            yield f"data: {item}\n\n"
            continue
        if isinstance(item, ErrorEvent):
            body = error_body(item.message, "server_error", code=item.code)
            body["usage"] = item.usage.model_dump()
            yield f"data: {json.dumps(body)}\n\n"
            break
        yield f"data: {item.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"


def stream_usage(options: Any) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a request's `stream_options`."""
    include_usage = bool(options and options.include_usage)
    return include_usage, include_usage and bool(options and options.continuous_usage_stats)


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body is read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Run `work`, cancelling it (and so the job) if the client disconnects first."""
    task = asyncio.create_task(work)
    disconnect = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
