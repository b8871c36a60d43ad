"""The OpenAPI document tells the truth: request bodies read by hand are described, every
operation lists the error statuses it can answer (OpenAI's error body), and FastAPI's
default 422 (never sent: validation errors are 400 here, as OpenAI answers) is removed."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from schemas.errors import ErrorResponse

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}

API_ERRORS = {
    "400": "Invalid request: a field, the JSON body or the context length",
    "401": "Missing or unknown API key",
    "404": "No such model, adapter, file or batch (or not the caller's team's)",
    "408": "The request's body did not arrive in time",
    "413": "The request's body is over the limit",
    "429": "Over the team's quota, the pool's capacity, or too many failed authentications",
    "500": "An unexpected error",
    "503": "No ready replica, or the queue or the token relay is unavailable",
}
"""What every `/v1` operation can answer besides success."""
ADMIN_ERRORS = {
    "403": "A team key: the admin API takes admin keys only",
    "409": "The change conflicts with the deployment's state (an existing version, a pool in "
    "use, a canary in progress, an evaluation missing)",
}
"""What the admin API (`/v1/deployments`) answers besides the `/v1` errors."""
ADAPTER_ERRORS = {
    "403": "A team key naming another team: team keys manage their own team's adapters",
    "409": "The name is a deployment's",
}
"""What the adapters API (`/v1/adapters`) answers besides the `/v1` errors."""
EXTRA_ERRORS = {
    ("/v1/chat/completions", "post"): {"504": "The request did not finish before its deadline"},
    ("/readyz", "get"): {"503": "Not ready: the broker, Redis or a worker is missing"},
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


def _document(path: str, method: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    responses.pop("422", None)
    errors = dict(API_ERRORS) if path.startswith("/v1/") else {"500": API_ERRORS["500"]}
    errors.update(EXTRA_ERRORS.get((path, method), {}))
    if path.startswith("/v1/deployments"):
        errors.update(ADMIN_ERRORS)
    if path.startswith("/v1/adapters"):
        errors.update(ADAPTER_ERRORS)
    for status, description in errors.items():
        responses.setdefault(status, _error(description))


def install_openapi(app: FastAPI, body_models: list[type[BaseModel]]) -> None:
    """Finish the app's OpenAPI document: components for `JsonBody` models and errors."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        models: list[type[BaseModel]] = [*body_models, ErrorResponse]
        _, defs = models_json_schema(
            [(m, "validation") for m in models],
            ref_template="#/components/schemas/{model}",
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in defs.get("$defs", {}).items():
            components.setdefault(name, definition)
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)  # only FastAPI's 422, which is never sent
        for path, methods in schema.get("paths", {}).items():
            for method, operation in methods.items():
                _document(path, method, operation)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
