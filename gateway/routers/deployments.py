"""The admin API for deployments: `PUT /v1/deployments/{name}` (register a version),
`GET /v1/deployments`, `GET /v1/deployments/{name}`, and the actions `POST
/v1/deployments/{name}:canary`, `:promote`, `:rollback` (Google's custom-method style: names
may hold `/` but never `:`). Admin keys only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import current_admin
from gateway.errors import ApiError
from gateway.services.deployments import DeploymentsService
from schemas.deployments_api import (
    CanaryRequest,
    DeploymentList,
    DeploymentObject,
    EvaluationRequest,
    ScaleRequest,
)
from schemas.registry import DeploymentSpec

router = APIRouter(dependencies=[Depends(current_admin)], tags=["admin"])


async def _service(request: Request) -> DeploymentsService:
    service: DeploymentsService = request.app.state.deployments_service
    return service


Service = Annotated[DeploymentsService, Depends(_service)]


@router.get("/v1/deployments")
async def list_deployments(service: Service) -> DeploymentList:
    return service.list()


@router.get("/v1/deployments/{name:path}")
async def retrieve_deployment(name: str, service: Service) -> DeploymentObject:
    return service.get(name)


@router.put("/v1/deployments/{name:path}")
async def put_deployment_version(
    name: str, spec: DeploymentSpec, service: Service, response: Response
) -> DeploymentObject:
    """Register a new immutable version of `name` (creating the deployment with its first).
    201 when the deployment was created, 200 otherwise."""
    deployment, created = await service.put(name, spec)
    response.status_code = 201 if created else 200
    return deployment


@router.patch("/v1/deployments/{name:path}")
async def scale_deployment_version(
    name: str, body: ScaleRequest, service: Service
) -> DeploymentObject:
    """Change a version's replica bounds; scale-in drains the replicas it stops."""
    return await service.scale(name, body.version, body.replicas)


@router.post("/v1/deployments/{name:path}")
async def deployment_action(
    name: str, service: Service, body: CanaryRequest | EvaluationRequest | None = None
) -> DeploymentObject:
    """`{name}:canary` (body: version, and percent or policy), `{name}:promote`,
    `{name}:rollback`, `{name}:evaluations` (body: version, result): the path's `name` ends
    with the action."""
    target = name
    name, _, action = target.rpartition(":")
    if action == "canary":
        if not isinstance(body, CanaryRequest):
            raise ApiError(400, '`:canary` needs a body: {"version", "percent" or "policy"}.')
        return await service.canary(name, body.version, body.percent, body.policy)
    if action == "evaluations":
        if not isinstance(body, EvaluationRequest):
            raise ApiError(400, '`:evaluations` needs a body: {"version", "result"}.')
        return await service.record_evaluation(name, body.version, body.result)
    if action == "promote":
        return await service.promote(name)
    if action == "rollback":
        return await service.rollback(name)
    raise ApiError(
        404,
        f"No action `{target}`: POST /v1/deployments/{{name}}:canary, :promote, :rollback "
        "or :evaluations.",
        code="unknown_action",
    )
