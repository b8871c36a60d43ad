"""`GET /v1/models` and `GET /v1/models/{model}`: the served deployments, and the calling
team's LoRA adapters with `parent` (and `root`) naming their base, as vLLM's server lists
its adapters."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from gateway.auth import Team, current_team
from gateway.services.registry import ModelRegistry
from schemas.models_api import Model, ModelList

router = APIRouter()


async def _registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


Registry = Annotated[ModelRegistry, Depends(_registry)]
CurrentTeam = Annotated[Team, Depends(current_team)]


@router.get("/v1/models")
async def list_models(team: CurrentTeam, registry: Registry, request: Request) -> ModelList:
    created = int(request.app.state.started_at)
    data = [Model(id=d.name, created=created, root=d.name) for d in registry.deployments]
    served = {d.name for d in registry.deployments}
    for adapter in sorted(registry.adapters_of(team.name), key=lambda a: a.name):
        if adapter.base in served:
            data.append(
                Model(
                    id=adapter.name,
                    created=adapter.created_at,
                    owned_by=team.name,
                    root=adapter.base,
                    parent=adapter.base,
                )
            )
    return ModelList(data=data)


@router.get("/v1/models/{model}")
async def retrieve_model(
    model: str, team: CurrentTeam, registry: Registry, request: Request
) -> Model:
    route = registry.route_for(team.name, model)
    if route.adapter is None:
        name = route.deployment.name
        return Model(id=name, created=int(request.app.state.started_at), root=name)
    adapter = registry.adapter(team.name, model)
    created = adapter.created_at if adapter is not None else int(request.app.state.started_at)
    base = route.deployment.name
    return Model(id=model, created=created, owned_by=team.name, root=base, parent=base)
