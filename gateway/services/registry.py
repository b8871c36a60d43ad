"""Model resolution (name -> deployment) and the live view of replicas from heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import structlog

from control.registry import AdapterCatalog
from control.served import Prepare, ServedModels
from gateway.errors import ApiError, model_not_found
from gateway.settings import Deployment
from schemas.adapters import AdapterRecord
from schemas.heartbeat import ReplicaHeartbeat
from schemas.messages import AdapterRef, Arm
from topics.ports import ReplicaDirectory

log = structlog.get_logger()


class ReplicaView:
    """Replicas by pool, refreshed from the directory in the background."""

    def __init__(self, directory: ReplicaDirectory, refresh_s: float) -> None:
        self._directory = directory
        self._refresh_s = refresh_s
        self._by_pool: dict[str, list[ReplicaHeartbeat]] = {}
        self._task: asyncio.Task[None] | None = None
        self.refreshed_at = 0.0

    async def refresh(self) -> None:
        by_pool: dict[str, list[ReplicaHeartbeat]] = {}
        for replica in await self._directory.replicas():
            by_pool.setdefault(replica.pool, []).append(replica)
        self._by_pool = by_pool
        self.refreshed_at = time.monotonic()

    async def start(self) -> None:
        with contextlib.suppress(Exception):
            await self.refresh()
        self._task = asyncio.create_task(self._loop(), name="replica-view")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # Redis away: keep the last view, try again next tick
                log.warning("replica_refresh_failed", error=type(exc).__name__)

    def ready(self, pool: str) -> list[ReplicaHeartbeat]:
        return [r for r in self._by_pool.get(pool, []) if r.state == "ready" and r.healthy]

    def by_pool(self) -> dict[str, list[ReplicaHeartbeat]]:
        """Every live replica, by pool, as of the last refresh."""
        return dict(self._by_pool)


@dataclass(frozen=True)
class Route:
    """Where a request for a model name runs: a deployment version, how it was chosen, and
    the team's LoRA adapter applied to it (None: the base model alone)."""

    deployment: Deployment
    arm: Arm
    adapter: AdapterRef | None = None


class ModelRegistry:
    """The served models (`ServedModels`, kept in step with the registry log by `apply`), as
    the API answers for them, and whether each has a ready replica."""

    def __init__(
        self,
        deployments: list[Deployment],
        replicas: ReplicaView,
        prepare: Prepare | None = None,
        default: str | None = None,
        adapters: AdapterCatalog | None = None,
    ) -> None:
        self.served = ServedModels(deployments, prepare)
        self._default = default
        self._adapters = adapters
        self.apply = self.served.apply
        self.replicas = replicas

    @property
    def deployments(self) -> list[Deployment]:
        """The stable version of every deployment."""
        return list(self.served.stable.values())

    @property
    def default(self) -> Deployment | None:
        """The model `/readyz` checks: the one named at start-up (the first configured) while
        the registry serves it, else the first served."""
        named = self.served.find(self._default) if self._default else None
        return named or next(iter(self.served.stable.values()), None)

    def versions(self, name: str) -> dict[str, Deployment]:
        return self.served.versions(name)

    def resolve(self, model: str) -> Deployment:
        """The deployment `model` names (`name` or `name@version`); 404 when none."""
        deployment = self.served.find(model)
        if deployment is None:
            raise model_not_found(model)
        return deployment

    def route(self, model: str, sticky: str | None = None) -> tuple[Deployment, Arm]:
        """The version a request for `model` runs on and its arm (`ServedModels.route`);
        404 when nothing is served under `model`."""
        routed = self.served.route(model, sticky)
        if routed is None:
            raise model_not_found(model)
        return routed

    def adapter(self, team: str, name: str) -> AdapterRecord | None:
        """Team `team`'s adapter `name` (None: none, or no adapters in this process)."""
        return self._adapters.adapter(team, name) if self._adapters is not None else None

    def adapters_of(self, team: str) -> list[AdapterRecord]:
        """Team `team`'s adapters."""
        if self._adapters is None:
            return []
        return [a for a in self._adapters.adapters if a.team == team]

    def route_for(self, team: str, model: str, sticky: str | None = None) -> Route:
        """What a request of `team` for `model` runs on: a deployment (see `route`), else
        the team's adapter of that name on its base's stable version (an adapter is trained
        on one base's weights, so it never follows that base's canary). 404 when `team` has
        neither; 400 for an adapter workers could not load."""
        routed = self.served.route(model, sticky)
        if routed is not None:
            return Route(*routed)
        adapter = self.adapter(team, model)
        if adapter is None:
            raise model_not_found(model)
        if adapter.status == "failed":
            raise ApiError(
                400,
                f"The adapter `{model}` failed to load on its base `{adapter.base}` "
                f"({adapter.failure}); register working weights again with PUT "
                f"/v1/adapters/{model}.",
                param="model",
                code="adapter_failed",
            )
        base = self.served.stable.get(adapter.base)
        if base is None:
            raise model_not_found(model)
        return Route(base, "stable", adapter.ref)

    def require_ready(self, deployment: Deployment) -> None:
        """503 when no ready replica of the deployment's pool is heartbeating."""
        if not self.replicas.ready(deployment.pool):
            raise ApiError(
                503,
                f"No ready replica is serving `{deployment.name}` right now; retry shortly.",
                type_="server_error",
                code="model_unavailable",
                headers={"Retry-After": "5"},
            )
