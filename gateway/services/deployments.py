"""The admin API's logic: register deployment versions in the registry and describe them.

A version is immutable: registering the same version again with the same spec changes nothing
(a retried PUT is safe); with a different spec it is refused (409), since a change is a new
version. A new deployment's first version takes all of its traffic; a later version takes
none until a rollout gives it some.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from control.registry import DeploymentRegistry, RegistryConflict, RegistryUnavailable, first_record
from control.served import Prepare
from control.traffic import (
    EVALUATIONS_KEPT,
    numerics_change,
    promote,
    roll_back,
    start_canary,
)
from gateway.errors import ApiError
from gateway.services.registry import ModelRegistry
from schemas.deployment import ReplicaBounds
from schemas.deployments_api import DeploymentList, DeploymentObject
from schemas.registry import DeploymentRecord, DeploymentSpec, DeploymentVersion, is_valid_name
from schemas.rollout import EvalResult, Rollout, RolloutPolicy


def deployment_not_found(name: str) -> ApiError:
    return ApiError(
        404, f"No deployment is named `{name}`.", param="name", code="deployment_not_found"
    )


class DeploymentsService:
    def __init__(
        self,
        registry: DeploymentRegistry,
        models: ModelRegistry,
        prepare: Prepare,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._models = models
        self._prepare = prepare
        self._now = now

    def _object(self, record: DeploymentRecord) -> DeploymentObject:
        pools = {v.pool for v in record.versions}
        ready = {pool: len(self._models.replicas.ready(pool)) for pool in pools}
        return DeploymentObject.of(record, ready)

    def list(self) -> DeploymentList:
        records = sorted(self._registry.records.values(), key=lambda r: r.name)
        return DeploymentList(data=[self._object(r) for r in records])

    def get(self, name: str) -> DeploymentObject:
        record = self._registry.get(name)
        if record is None:
            raise deployment_not_found(name)
        return self._object(record)

    async def put(self, name: str, spec: DeploymentSpec) -> tuple[DeploymentObject, bool]:
        """Register `spec` as a version of `name`; (the deployment, whether it was created)."""
        if not is_valid_name(name):
            raise ApiError(
                400,
                f"`{name}` is not a valid deployment name: letters, digits, `.`, `_`, `-` "
                "and `/`, starting with a letter or digit, at most 128 characters.",
                param="name",
                code="invalid_name",
            )
        version = DeploymentVersion(**spec.model_dump(), created_at=int(self._now()))
        try:
            # Its tokenizer must load before the version is registered: a version no gateway
            # can render prompts for would be refused by every one of them.
            await self._prepare(spec.serving(name))
        except Exception as exc:
            raise ApiError(
                400,
                f"`path` {spec.path!r} holds no tokenizer this gateway can load: {exc}",
                param="path",
                code="invalid_path",
            ) from exc
        created = False

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            nonlocal created
            if current is None:
                created = True
                return first_record(name, version)
            existing = current.version(spec.version)
            if existing is not None:
                # Replicas change through `scale` (PATCH), so a retried PUT still matches.
                if existing.spec().model_copy(update={"replicas": spec.replicas}) == spec:
                    return current  # a retried PUT: nothing to change
                raise ApiError(
                    409,
                    f"Version `{spec.version}` of `{name}` exists with another spec; versions "
                    "are immutable, so register the change as a new version.",
                    param="version",
                    code="version_exists",
                )
            for other in current.versions:
                if other.pool == spec.pool and other.lifecycle != "retired":
                    raise ApiError(
                        409,
                        f"Pool `{spec.pool}` already runs version `{other.version}` of "
                        f"`{name}`; each version of a deployment needs a pool of its own "
                        f"(its workers), for example `{spec.pool}-{spec.version}`.",
                        param="pool",
                        code="pool_in_use",
                    )
            return current.model_copy(update={"versions": (*current.versions, version)})

        return self._object(await self._write(name, change)), created

    async def canary(
        self,
        name: str,
        version: str,
        percent: float | None = None,
        policy: RolloutPolicy | None = None,
    ) -> DeploymentObject:
        """Start a rollout of `version`: a fixed `percent` of the deployment's requests (those
        not pinned), or, without one, the policy's steps (5% -> 25% -> 100%), each taken by
        the rollout controller while the canary is as healthy as the stable version."""
        chosen = policy or RolloutPolicy()
        if percent is not None:
            chosen = chosen.model_copy(update={"steps": (percent,), "auto_promote": False})
        rollout = Rollout(policy=chosen, step_started_at=self._now())

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            record = _existing(name, current)
            candidate = _live_version(record, version)
            if version == record.traffic.stable:
                raise ApiError(
                    409, f"`{version}` is already the stable version of `{name}`.",
                    param="version", code="already_stable",
                )  # fmt: skip
            if record.traffic.canary not in (None, version):
                raise ApiError(
                    409,
                    f"Version `{record.traffic.canary}` of `{name}` is already the canary; "
                    "promote or roll it back first.",
                    param="version",
                    code="canary_in_progress",
                )
            stable = record.version(record.traffic.stable)
            if stable is not None:
                _require_eval(name, candidate, stable)
            return start_canary(record, version, rollout)

        return self._object(await self._write(name, change))

    async def record_evaluation(
        self, name: str, version: str, result: EvalResult
    ) -> DeploymentObject:
        """Keep an evaluation of `version` against `result.reference` in its record (the
        latest ten); a passing one against the stable version opens the eval gate."""

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            record = _existing(name, current)
            evaluated = _live_version(record, version)
            if record.version(result.reference) is None:
                raise ApiError(
                    404,
                    f"`{name}` has no version `{result.reference}` to compare with.",
                    param="result.reference",
                    code="version_not_found",
                )
            kept = (*evaluated.evaluations, result)[-EVALUATIONS_KEPT:]
            versions = tuple(
                v.model_copy(update={"evaluations": kept}) if v.version == version else v
                for v in record.versions
            )
            return record.model_copy(update={"versions": versions})

        return self._object(await self._write(name, change))

    async def scale(self, name: str, version: str, replicas: ReplicaBounds) -> DeploymentObject:
        """Change how many replicas `version` runs: its one mutable field (capacity, not
        numerics). The pool controller starts or drains replicas to match."""

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            record = _existing(name, current)
            _live_version(record, version)
            versions = tuple(
                v.model_copy(update={"replicas": replicas}) if v.version == version else v
                for v in record.versions
            )
            return record.model_copy(update={"versions": versions})

        return self._object(await self._write(name, change))

    async def promote(self, name: str) -> DeploymentObject:
        """The canary becomes the stable version, taking every request; the old stable
        version drains (its running streams finish; it takes no new requests)."""

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            record = _existing(name, current)
            _current_canary(record)
            return promote(record, self._now(), "operator")

        return self._object(await self._write(name, change))

    async def rollback(self, name: str) -> DeploymentObject:
        """Every request goes back to the stable version; the canary drains."""

        def change(current: DeploymentRecord | None) -> DeploymentRecord:
            record = _existing(name, current)
            _current_canary(record)
            return roll_back(record, self._now(), "operator")

        return self._object(await self._write(name, change))

    async def _write(
        self, name: str, change: Callable[[DeploymentRecord | None], DeploymentRecord]
    ) -> DeploymentRecord:
        try:
            return await self._registry.update(name, change)
        except RegistryConflict as exc:
            raise ApiError(409, str(exc), code="conflict") from exc
        except RegistryUnavailable as exc:
            raise ApiError(
                503, str(exc), type_="server_error", code="registry_unavailable"
            ) from exc


def _existing(name: str, current: DeploymentRecord | None) -> DeploymentRecord:
    if current is None:
        raise deployment_not_found(name)
    return current


def _live_version(record: DeploymentRecord, version: str) -> DeploymentVersion:
    found = record.version(version)
    if found is None:
        raise ApiError(
            404,
            f"`{record.name}` has no version `{version}`.",
            param="version",
            code="version_not_found",
        )
    if found.lifecycle != "active":
        raise ApiError(
            409,
            f"Version `{version}` of `{record.name}` is {found.lifecycle}; register a new "
            "version instead.",
            param="version",
            code="version_not_active",
        )
    return found


def _current_canary(record: DeploymentRecord) -> str:
    if record.traffic.canary is None:
        raise ApiError(
            409, f"`{record.name}` has no canary to promote or roll back.", code="no_canary"
        )
    return record.traffic.canary


def _require_eval(name: str, candidate: DeploymentVersion, stable: DeploymentVersion) -> None:
    """Refuse traffic to a version whose numerics differ from the stable one's until it has
    passed the evaluation suite against it. A `failed` stable version is no reference (it
    cannot run to be compared with): a version that replaces it is not gated on it."""
    if stable.lifecycle == "failed":
        return
    change = numerics_change(candidate, stable)
    if change is None or candidate.passed_eval(stable.version) is not None:
        return
    latest = candidate.latest_eval(stable.version)
    found = (
        "no suite evaluation of it against that version is recorded"
        if latest is None
        else f"its latest evaluation against it failed ({_failures(latest)})"
    )
    raise ApiError(
        409,
        f"Version `{candidate.version}` {change}: a change of numerics must pass the "
        f"evaluation suite against the stable version `{stable.version}` before it takes "
        f"traffic, and {found}. Run `llmq eval {name}@{candidate.version}`.",
        param="version",
        code="eval_required",
    )


def _failures(result: EvalResult) -> str:
    failed = [
        f"{metric} {result.scores.get(metric, 0.0):.2f}, needs {bound:.2f}"
        for metric, bound in result.thresholds.items()
        if result.scores.get(metric, 0.0) < bound
    ]
    return "; ".join(failed) or "see its scores"
