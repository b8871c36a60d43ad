"""Teams' LoRA adapters: register (`PUT /v1/adapters/{name}`), list, describe, delete.

Registration checks everything that can be checked before a worker ever sees the adapter,
so a bad one is a 400 here rather than failed requests later: the base is a served
deployment whose workers run LoRA, the rank fits their `max_lora_rank`, and the folder at
`weights_uri` is reachable, matches `sha256` and is a PEFT adapter of the declared rank.
What only the engine can find (tensors shaped for another base) fails that adapter's
requests with a clear error and marks it `failed` (`mark_failed`); nothing else is touched.

Visibility: a team sees and uses only its own adapters; another team's is a 404 exactly like
a name that does not exist. Admin keys see every team's and register for any team.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from control.registry import DeploymentRegistry
from gateway.auth import Caller
from gateway.errors import ApiError
from schemas.adapters import (
    AdapterDeleted,
    AdapterList,
    AdapterObject,
    AdapterRecord,
    AdapterSpec,
    is_valid_adapter_name,
)
from schemas.messages import AdapterRef
from schemas.registry import DeploymentRecord

log = structlog.get_logger()

MAX_LORA_RANK_ARG = "max_lora_rank"
"""The `engine_args` key that turns LoRA on for a deployment's workers (0 or absent: off)."""


@dataclass(frozen=True)
class AdapterFiles:
    """What an adapter folder says of itself (its adapter_config.json)."""

    rank: int
    target_modules: tuple[str, ...]


class AdapterFilesError(ValueError):
    """The folder is not a usable adapter: its `code` and message say why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AdapterFilesInspector(Protocol):
    """Reads an adapter folder from object storage, checking its digest first."""

    async def inspect(self, uri: str, sha256: str) -> AdapterFiles:
        """The folder's adapter_config; `AdapterFilesError` when it is unreachable, does
        not match `sha256` (code `sha256_mismatch`) or is no PEFT LoRA adapter."""
        ...


def max_lora_rank(record: DeploymentRecord) -> int:
    """The LoRA rank the stable version's workers take (0: they run no LoRA)."""
    stable = record.version(record.traffic.stable)
    value: Any = stable.engine_args.get(MAX_LORA_RANK_ARG, 0) if stable is not None else 0
    return int(value or 0)


def adapter_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f"No adapter named `{name}` exists or you do not have access to it.",
        param="name",
        code="adapter_not_found",
    )


class AdaptersService:
    def __init__(
        self,
        registry: DeploymentRegistry,
        inspector: AdapterFilesInspector,
        knows_team: Callable[[str], bool],
        now: Callable[[], float] = time.time,
        uri_prefix: str | None = None,
    ) -> None:
        self._uri_prefix = uri_prefix
        self._registry = registry
        self._inspector = inspector
        self._knows_team = knows_team
        self._now = now

    def _owner(self, caller: Caller, team: str | None) -> str:
        """The team an adapter call is about: a team key's own; the one an admin names."""
        if caller.team is not None:
            if team is not None and team != caller.team.name:
                raise ApiError(
                    403,
                    "A team key manages only its own team's adapters.",
                    type_="permission_error",
                    param="team",
                    code="permission_denied",
                )
            return caller.team.name
        if team is None:
            raise ApiError(400, "An admin key must name the adapter's `team`.", param="team")
        if not self._knows_team(team):
            raise ApiError(400, f"No team is named `{team}`.", param="team", code="unknown_team")
        return team

    def list(self, caller: Caller, team: str | None = None) -> AdapterList:
        """The caller's team's adapters (an admin: every team's, or `team`'s)."""
        records = self._registry.adapters
        if caller.team is not None or team is not None:
            owner = self._owner(caller, team)
            records = [r for r in records if r.team == owner]
        records.sort(key=lambda r: (r.team, r.name))
        return AdapterList(data=[AdapterObject.of(r) for r in records])

    def get(self, caller: Caller, name: str, team: str | None = None) -> AdapterObject:
        record = self._registry.adapter(self._owner(caller, team), name)
        if record is None:
            raise adapter_not_found(name)
        return AdapterObject.of(record)

    async def put(self, caller: Caller, name: str, spec: AdapterSpec) -> tuple[AdapterObject, bool]:
        """Register (or replace) an adapter; (it, whether it was created)."""
        team = self._owner(caller, spec.team)
        if not is_valid_adapter_name(name):
            raise ApiError(
                400,
                f"`{name}` is not a valid adapter name: letters, digits, `.`, `_` and `-`, "
                "starting with a letter or digit, at most 128 characters.",
                param="name",
                code="invalid_name",
            )
        if self._registry.get(name) is not None:
            raise ApiError(
                409,
                f"`{name}` is a deployment's name; an adapter needs a name of its own.",
                param="name",
                code="name_in_use",
            )
        base = self._registry.get(spec.base)
        if base is None:
            raise ApiError(
                400, f"No deployment is named `{spec.base}`.", param="base", code="unknown_base"
            )
        if self._uri_prefix is not None:
            allowed = self._uri_prefix.replace("{team}", team)
            if not spec.weights_uri.startswith(allowed) or ".." in spec.weights_uri:
                raise ApiError(
                    400,
                    f"Team {team}'s adapters must be under {allowed}.",
                    param="weights_uri",
                    code="weights_uri_not_allowed",
                )
        limit = max_lora_rank(base)
        if limit == 0:
            raise ApiError(
                400,
                f"`{spec.base}` runs without LoRA: its stable version sets no "
                f"`engine_args.{MAX_LORA_RANK_ARG}`.",
                param="base",
                code="lora_not_enabled",
            )
        if spec.rank > limit:
            raise ApiError(
                400,
                f"Rank {spec.rank} is above `{spec.base}`'s max_lora_rank of {limit}.",
                param="rank",
                code="rank_too_large",
            )
        await self._check_files(spec)
        created = False
        now = int(self._now())

        def change(current: AdapterRecord | None) -> AdapterRecord:
            nonlocal created
            created = current is None
            wanted = AdapterRecord(
                name=name,
                team=team,
                base=spec.base,
                weights_uri=spec.weights_uri,
                sha256=spec.sha256,
                rank=spec.rank,
                created_at=current.created_at if current is not None else now,
            )
            if current is not None and current.status == "ready":
                fields = set(AdapterSpec.model_fields) - {"team"}
                if current.model_dump(include=fields) == wanted.model_dump(include=fields):
                    return current  # a retried PUT: nothing to change
            return wanted

        record = await self._registry.update_adapter(team, name, change)
        if record is None:  # deleted between our write and its fold
            raise adapter_not_found(name)
        log.info("adapter_registered", team=team, adapter=name, base=spec.base, rank=spec.rank)
        return AdapterObject.of(record), created

    async def _check_files(self, spec: AdapterSpec) -> None:
        try:
            files = await self._inspector.inspect(spec.weights_uri, spec.sha256)
        except AdapterFilesError as exc:
            raise ApiError(400, str(exc), param="weights_uri", code=exc.code) from exc
        if files.rank != spec.rank:
            raise ApiError(
                400,
                f"The adapter at {spec.weights_uri} has rank {files.rank}, not {spec.rank}.",
                param="rank",
                code="rank_mismatch",
            )

    async def delete(self, caller: Caller, name: str, team: str | None = None) -> AdapterDeleted:
        """Delete an adapter: new requests naming it get 404; queued and running ones finish
        (each job carries its adapter's location)."""
        owner = self._owner(caller, team)
        if self._registry.adapter(owner, name) is None:
            raise adapter_not_found(name)
        await self._registry.update_adapter(owner, name, lambda _current: None)
        log.info("adapter_deleted", team=owner, adapter=name)
        return AdapterDeleted(id=name)

    async def mark_failed_ref(self, adapter: AdapterRef, reason: str) -> None:
        """`mark_failed` for the adapter a failed job carried (`team/name`)."""
        team, _, name = adapter.id.partition("/")
        try:
            await self.mark_failed(team, name, adapter.sha256, reason)
        except Exception as exc:  # the registry away: the next failing request tries again
            log.warning("adapter_mark_failed_failed", adapter=adapter.id, error=repr(exc))

    async def mark_failed(self, team: str, name: str, sha256: str, reason: str) -> None:
        """Record that workers cannot load the adapter (only the registered weights whose
        load failed: a re-registration since then is left as it is)."""

        def change(current: AdapterRecord | None) -> AdapterRecord | None:
            if current is None or current.sha256 != sha256 or current.status == "failed":
                return current
            return current.model_copy(update={"status": "failed", "failure": reason[:500]})

        await self._registry.update_adapter(team, name, change)
        log.warning("adapter_failed", team=team, adapter=name, sha256=sha256[:12])
