"""What a process serves: each deployment's servable versions and its stable one, built from
configuration, then kept in step with the registry (`apply` is a registry listener)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable

import structlog

from schemas.deployment import Deployment
from schemas.messages import Arm
from schemas.registry import DeploymentRecord, TrafficSplit, split_model

log = structlog.get_logger()

Prepare = Callable[[Deployment], Awaitable[None]]
"""Loads what serving a deployment version takes (its tokenizer); raises when it cannot."""


def canary_draw(name: str, sticky: str | None) -> float:
    """Where a request falls in [0, 100): from `sticky` (its `prompt_cache_key` or `user`)
    when it has one, so a caller's requests keep one arm (and, as the canary's share grows,
    those already on the canary stay there); at random otherwise."""
    if sticky is None:
        return random.random() * 100.0
    digest = hashlib.sha256(f"{name}\x00{sticky}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100.0


class ServedModels:
    def __init__(self, deployments: list[Deployment], prepare: Prepare | None = None) -> None:
        self._stable = {d.name: d for d in deployments}
        self._versions = {d.name: {d.version: d} for d in deployments}
        self._traffic: dict[str, TrafficSplit] = {}
        self._prepare = prepare

    @property
    def stable(self) -> dict[str, Deployment]:
        """The stable version of every deployment, by name (in registration order)."""
        return dict(self._stable)

    def versions(self, name: str) -> dict[str, Deployment]:
        """The servable versions of `name`."""
        return dict(self._versions.get(name, {}))

    def in_rollout(self, name: str) -> bool:
        """Whether deployment `name` has a canary taking traffic."""
        traffic = self._traffic.get(name)
        return traffic is not None and traffic.canary is not None

    def find(self, model: str) -> Deployment | None:
        """What `model` names: `name` (its stable version) or `name@version` (that version,
        while it is neither retired nor failed); None when nothing is served under it."""
        name, version = split_model(model)
        if version is None:
            return self._stable.get(name)
        return self._versions.get(name, {}).get(version)

    def route(self, model: str, sticky: str | None = None) -> tuple[Deployment, Arm] | None:
        """The version a request for `model` runs on, and how it was chosen: a pinned
        version as named; otherwise the canary for its share of requests (see
        `canary_draw`), the stable version for the rest."""
        name, version = split_model(model)
        if version is not None:
            pinned = self._versions.get(name, {}).get(version)
            return (pinned, "pinned") if pinned is not None else None
        stable = self._stable.get(name)
        if stable is None:
            return None
        traffic = self._traffic.get(name)
        if traffic is not None and traffic.canary is not None and traffic.canary_percent > 0:
            canary = self._versions[name].get(traffic.canary)
            if canary is not None and canary_draw(name, sticky) < traffic.canary_percent:
                return canary, "canary"
        return stable, "stable"

    async def apply(self, name: str, record: DeploymentRecord | None) -> None:
        """Serve what `record` says of `name`. A version that cannot be prepared (its
        tokenizer does not load) is left out, and logged, never the whole deployment."""
        if record is None:
            self._stable.pop(name, None)
            self._versions.pop(name, None)
            self._traffic.pop(name, None)
            return
        known = self._versions.get(name, {})
        versions: dict[str, Deployment] = {}
        for version in record.versions:
            if version.lifecycle in ("retired", "failed"):  # no replica serves it
                continue
            deployment = version.serving(name)
            if known.get(version.version) != deployment and self._prepare is not None:
                try:
                    await self._prepare(deployment)
                except Exception as exc:
                    log.error("deployment_unservable", model=deployment.ref, error=str(exc))
                    continue
            versions[version.version] = deployment
        self._versions[name] = versions
        self._traffic[name] = record.traffic
        stable = versions.get(record.traffic.stable)
        if stable is not None:
            self._stable[name] = stable
        else:
            self._stable.pop(name, None)
