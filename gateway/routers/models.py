"""`GET /v1/models` and `GET /v1/models/{model}`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from gateway.auth import Team, current_team
from gateway.services.registry import ModelRegistry
from schemas.models_api import Model, ModelList

router = APIRouter()


def _registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


@router.get("/v1/models")
async def list_models(
    _: Annotated[Team, Depends(current_team)],
    registry: Annotated[ModelRegistry, Depends(_registry)],
    request: Request,
) -> ModelList:
    created = int(request.app.state.started_at)
    return ModelList(data=[Model(id=d.name, created=created) for d in registry.deployments])


@router.get("/v1/models/{model}")
async def retrieve_model(
    model: str,
    _: Annotated[Team, Depends(current_team)],
    registry: Annotated[ModelRegistry, Depends(_registry)],
    request: Request,
) -> Model:
    deployment = registry.resolve(model)
    return Model(id=deployment.name, created=int(request.app.state.started_at))
