"""`POST /v1/chat/completions`: HTTP only; the logic lives in `ChatService`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.auth import Team, current_team
from gateway.request_body import JsonBody, json_body_openapi
from gateway.routers.responding import sse, stream_usage, unless_disconnected
from gateway.services.chat import ChatService
from schemas.chat import ChatCompletionRequest

router = APIRouter()


async def _service(request: Request) -> ChatService:
    service: ChatService = request.app.state.chat_service
    return service


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
        include_usage, continuous = stream_usage(body.stream_options)
        return StreamingResponse(
            sse(service.stream_chunks(active, include_usage, continuous)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": job.request_id},
        )
    completion = await unless_disconnected(request, service.complete(active))
    if completion is None:  # the caller left: the request was cancelled, nobody to answer
        return JSONResponse({}, status_code=499)
    return JSONResponse(completion.model_dump(), headers={"X-Request-Id": job.request_id})
