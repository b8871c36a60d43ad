"""OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """The JSON body of an OpenAI-style error."""
    return ErrorResponse(
        error=ErrorDetail(message=message, type=type_, param=param, code=code)
    ).model_dump()
