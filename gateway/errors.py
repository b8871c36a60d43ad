"""API errors in OpenAI's format, and the handlers that render them."""

from __future__ import annotations

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.errors import error_body


class ApiError(Exception):
    """An error the caller should see, with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, object]:
        return error_body(self.message, self.type, param=self.param, code=self.code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def _param_of(loc: tuple[int | str, ...]) -> str | None:
    """`("body", "messages", 0, "role")` -> `messages[0].role`; `("query", "limit")` ->
    `limit`."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = part
    return out or None


def _validation_message(err: dict[str, object], param: str | None) -> str:
    if err.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    if err.get("type") == "json_invalid":
        return "We could not parse the JSON body of your request."
    msg = str(err.get("msg", "Invalid value"))
    msg = msg.removeprefix("Value error, ")
    return f"Invalid value for '{param}': {msg}" if param else msg


async def _on_api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    first: dict[str, object] = dict(errors[0]) if errors else {}
    loc = first.get("loc", ())
    param = _param_of(tuple(loc)) if isinstance(loc, (tuple, list)) else None
    context = first.get("ctx")
    if param is None and isinstance(context, dict) and isinstance(context.get("param"), str):
        param = context["param"]  # a whole-body check that names the field to fix
    if first.get("type") == "json_invalid":
        param = None
    body = error_body(_validation_message(first, param), "invalid_request_error", param=param)
    return JSONResponse(body, status_code=400)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, APIRoute) and route.path_regex.match(request.url.path):
            methods |= route.methods
    return ", ".join(sorted(methods))


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    body = error_body(str(exc.detail), kind)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """A failure nobody turned into an `ApiError` (a store or broker down): a 500 in OpenAI's
    format instead of a bare one; the error's type is logged, never the request's content."""
    structlog.get_logger().error("request_failed", path=request.url.path, error=type(exc).__name__)
    body = error_body(
        "The server had an error while processing your request; retry shortly.", "server_error"
    )
    return JSONResponse(body, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _on_unexpected_error)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
