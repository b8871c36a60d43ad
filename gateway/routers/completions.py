"""`POST /v1/completions`: HTTP only; the logic lives in `CompletionService`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.auth import Team, current_team
from gateway.request_body import JsonBody, json_body_openapi
from gateway.routers.responding import sse, stream_usage, unless_disconnected
from gateway.services.completions import CompletionService
from schemas.completions import CompletionRequest

router = APIRouter()


async def _service(request: Request) -> CompletionService:
    service: CompletionService = request.app.state.completion_service
    return service


@router.post(
    "/v1/completions",
    response_model=None,
    openapi_extra=json_body_openapi(CompletionRequest),
    responses={
        200: {
            "description": "A `text_completion`, or with `stream` a stream of "
            "`text_completion` server-sent events ending with `data: [DONE]`",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    },
)
async def create_completion(
    request: Request,
    team: Annotated[Team, Depends(current_team)],
    body: Annotated[CompletionRequest, Depends(JsonBody(CompletionRequest))],
    service: Annotated[CompletionService, Depends(_service)],
) -> StreamingResponse | JSONResponse:
    active = await service.start(body, team)
    if body.stream:
        include_usage, continuous = stream_usage(body.stream_options)
        return StreamingResponse(
            sse(service.stream_chunks(active, include_usage, continuous)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": active.id},
        )
    completion = await unless_disconnected(request, service.complete(active))
    if completion is None:  # the caller left: the requests were cancelled
        return JSONResponse({}, status_code=499)
    return JSONResponse(completion.model_dump(), headers={"X-Request-Id": active.id})
