"""JSON request bodies parsed and validated off the event loop when they are large.

FastAPI parses a route's pydantic body on the event loop; for a body of a megabyte with
thousands of messages that is tens of milliseconds during which no stream on this gateway moves.
Routes that take large bodies use `JsonBody(Model)` as a dependency instead: small bodies are
validated inline (cheaper than a thread hop), large ones on the offload pool. Errors are
FastAPI's own `RequestValidationError`, so they reach the client in the same OpenAI format.
The route's OpenAPI request body still names the model (`json_body_openapi`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from gateway.services.offload import ThreadOffload

ModelT = TypeVar("ModelT", bound=BaseModel)

INLINE_BYTES = 64 * 1024
"""Bodies up to this size are validated on the event loop (well under a millisecond)."""


def _validate(model: type[ModelT], raw: bytes) -> ModelT:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors) from None


class JsonBody(Generic[ModelT]):
    """FastAPI dependency: the request's JSON body as `model`."""

    def __init__(self, model: type[ModelT]) -> None:
        self.model = model

    async def __call__(self, request: Request) -> ModelT:
        raw = await request.body()  # already read, and bounded, by BodyLimitMiddleware
        offload: ThreadOffload | None = getattr(request.app.state, "offload", None)
        if offload is None or len(raw) <= INLINE_BYTES:
            return _validate(self.model, raw)
        return await offload.run(_validate, self.model, raw)


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route taking `JsonBody(model)`: its request body schema."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }
