"""`POST /v1/chat/completions`: HTTP only; the logic lives in `ChatService`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.auth import Team, current_team
from gateway.request_body import JsonBody, json_body_openapi
from gateway.services.chat import ActiveRequest, ChatService
from schemas.chat import ChatCompletion, ChatCompletionRequest
from schemas.errors import error_body
from schemas.messages import ErrorEvent

router = APIRouter()


def _service(request: Request) -> ChatService:
    service: ChatService = request.app.state.chat_service
    return service


async def _sse(
    service: ChatService, active: ActiveRequest, include_usage: bool, continuous: bool
) -> AsyncIterator[str]:
    async for item in service.stream_chunks(active, include_usage, continuous):
        if isinstance(item, ErrorEvent):
            body = error_body(item.message, "server_error", code=item.code)
            body["usage"] = item.usage.model_dump()
            yield f"data: {json.dumps(body)}\n\n"
            break
        yield f"data: {item.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"


@router.post(
    "/v1/chat/completions",
    response_model=None,
    openapi_extra=json_body_openapi(ChatCompletionRequest),
    responses={
        200: {
            "description": "A `chat.completion`, or with `stream` a stream of "
            "`chat.completion.chunk` server-sent events ending with `data: [DONE]`",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    },
)
async def create_chat_completion(
    request: Request,
    team: Annotated[Team, Depends(current_team)],
    body: Annotated[ChatCompletionRequest, Depends(JsonBody(ChatCompletionRequest))],
    service: Annotated[ChatService, Depends(_service)],
) -> StreamingResponse | JSONResponse:
    active = await service.start(body, team)
    job = active.job
    if body.stream:
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and bool(options and options.continuous_usage_stats)
        return StreamingResponse(
            _sse(service, active, include_usage, continuous),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": job.request_id},
        )
    completion = await _unless_disconnected(request, service.complete(active))
    if completion is None:  # the caller left: the request was cancelled, nobody to answer
        return JSONResponse({}, status_code=499)
    return JSONResponse(completion.model_dump(), headers={"X-Request-Id": job.request_id})


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body is read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(
    request: Request, work: Coroutine[Any, Any, ChatCompletion]
) -> ChatCompletion | None:
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
