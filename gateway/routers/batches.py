"""`/v1/batches`: create, retrieve, list, cancel. HTTP only; the logic is in `BatchesService`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from gateway.auth import Team, current_team
from gateway.services.batches import BatchesService
from schemas.batches import Batch, BatchCreateRequest, BatchList

router = APIRouter()


async def _service(request: Request) -> BatchesService:
    service: BatchesService = request.app.state.batches_service
    return service


@router.post("/v1/batches")
async def create_batch(
    body: BatchCreateRequest,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[BatchesService, Depends(_service)],
) -> Batch:
    return await service.create(team.name, body)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(
    batch_id: str,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[BatchesService, Depends(_service)],
) -> Batch:
    return await service.retrieve(team.name, batch_id)


@router.get("/v1/batches")
async def list_batches(
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[BatchesService, Depends(_service)],
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    return await service.list(team.name, after, limit)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(
    batch_id: str,
    team: Annotated[Team, Depends(current_team)],
    service: Annotated[BatchesService, Depends(_service)],
) -> Batch:
    return await service.cancel(team.name, batch_id)
