"""The operator page: `GET /admin` (the page, no data in it) and `GET /admin/state` (what it
shows, admin keys only). Not part of the OpenAI-compatible API, so not in its schema.

The page (`gateway/static/admin.html`) is plain HTML and JavaScript, no build step: it asks
for an admin key, keeps it in the tab's sessionStorage and polls the state every two seconds;
every value is set as text, never as markup."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from gateway.auth import current_admin
from gateway.services.admin import AdminService
from schemas.admin import AdminState

ADMIN_PAGE = (resources.files("gateway") / "static" / "admin.html").read_text()
router = APIRouter(include_in_schema=False)


@router.get("/admin")
async def admin_page() -> HTMLResponse:
    return HTMLResponse(ADMIN_PAGE, headers={"Cache-Control": "no-store"})


@router.get("/admin/state", dependencies=[Depends(current_admin)])
async def admin_state(request: Request) -> AdminState:
    service: AdminService = request.app.state.admin_service
    return await service.state()
