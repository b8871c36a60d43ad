"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/healthz")
@router.get("/health")
async def healthz() -> dict[str, str]:
    """The process is alive and its event loop answers (`/health` is vLLM's name for it,
    which benchmark clients made for vLLM check before they start)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready only when the broker and Redis answer and the default model has a ready worker."""
    state = request.app.state
    checks: dict[str, bool] = {}
    try:
        await asyncio.wait_for(state.producer.partitions_for(state.probe_topic), 2.0)
        checks["kafka"] = True
    except Exception:
        checks["kafka"] = False
    try:
        checks["redis"] = bool(await asyncio.wait_for(state.redis.ping(), 2.0))
    except Exception:
        checks["redis"] = False
    default = state.registry.default
    checks["worker"] = bool(default and state.registry.replicas.ready(default.pool))
    ready = all(checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
