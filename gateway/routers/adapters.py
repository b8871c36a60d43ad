"""Teams' LoRA adapters: `PUT /v1/adapters/{name}` (register or replace), `GET /v1/adapters`,
`GET /v1/adapters/{name}`, `DELETE /v1/adapters/{name}`. Team keys manage their own team's;
admin keys any team's (naming it: `team` in the body, `?team=` on the others)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import Caller, current_caller
from gateway.services.adapters import AdaptersService
from schemas.adapters import AdapterDeleted, AdapterList, AdapterObject, AdapterSpec

router = APIRouter(tags=["adapters"])


async def _service(request: Request) -> AdaptersService:
    service: AdaptersService = request.app.state.adapters_service
    return service


Service = Annotated[AdaptersService, Depends(_service)]
CurrentCaller = Annotated[Caller, Depends(current_caller)]


@router.get("/v1/adapters")
async def list_adapters(
    service: Service, caller: CurrentCaller, team: str | None = None
) -> AdapterList:
    return service.list(caller, team)


@router.get("/v1/adapters/{name}")
async def retrieve_adapter(
    name: str, service: Service, caller: CurrentCaller, team: str | None = None
) -> AdapterObject:
    return service.get(caller, name, team)


@router.put("/v1/adapters/{name}")
async def put_adapter(
    name: str, spec: AdapterSpec, service: Service, caller: CurrentCaller, response: Response
) -> AdapterObject:
    """Register an adapter of a base deployment (201), or replace the caller's adapter of
    that name (200)."""
    adapter, created = await service.put(caller, name, spec)
    response.status_code = 201 if created else 200
    return adapter


@router.delete("/v1/adapters/{name}")
async def delete_adapter(
    name: str, service: Service, caller: CurrentCaller, team: str | None = None
) -> AdapterDeleted:
    return await service.delete(caller, name, team)
