"""The registry's fold and writes (over an in-memory log), the admin service's rules, and the
gateway's model resolution from registry records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from control.registry import DeploymentRegistry, RegistryConflict, first_record
from gateway.errors import ApiError
from gateway.services.deployments import DeploymentsService
from gateway.services.registry import ModelRegistry, ReplicaView
from schemas.deployment import Deployment
from schemas.registry import DeploymentRecord, DeploymentSpec, DeploymentVersion, split_model
from schemas.rollout import EvalResult
from topics.ports import RegistryEntry


class MemoryRegistryLog:
    """An in-memory log with the Kafka adapter's contract (for unit tests of the logic)."""

    def __init__(self) -> None:
        self.entries_: list[RegistryEntry] = []
        self._grew = asyncio.Condition()

    async def publish(self, name: str, record: DeploymentRecord | None) -> int:
        async with self._grew:
            offset = len(self.entries_)
            self.entries_.append(RegistryEntry(offset, name, record))
            self._grew.notify_all()
        return offset

    async def end_offset(self) -> int:
        return len(self.entries_)

    async def entries(self) -> AsyncIterator[RegistryEntry]:
        seen = 0
        while True:
            async with self._grew:
                await self._grew.wait_for(lambda seen=seen: len(self.entries_) > seen)
            while seen < len(self.entries_):
                yield self.entries_[seen]
                seen += 1


class NoReplicas:
    async def replicas(self) -> list[object]:
        return []


def _version(version: str = "1", pool: str = "p", **fields: object) -> DeploymentVersion:
    return DeploymentVersion(version=version, path="/m", pool=pool, created_at=1, **fields)  # type: ignore[arg-type]


def _spec(version: str = "2", pool: str = "p2", **fields: object) -> DeploymentSpec:
    return DeploymentSpec(version=version, path="/m", pool=pool, **fields)  # type: ignore[arg-type]


async def test_fold_keeps_the_first_record_of_each_revision_and_follows_deletes() -> None:
    log = MemoryRegistryLog()
    first = first_record("m", _version())
    await log.publish("m", first.model_copy(update={"written_by": "a"}))
    await log.publish("m", first.model_copy(update={"written_by": "b"}))  # lost the race
    registry = DeploymentRegistry(log)
    await registry.start()
    try:
        record = registry.get("m")
        assert record is not None and record.written_by == "a"
        offset = await log.publish("m", None)
        await registry.wait_folded(offset)
        assert registry.get("m") is None
    finally:
        await registry.stop()


async def test_update_retries_over_a_concurrent_writer_and_applies_on_top() -> None:
    log = MemoryRegistryLog()
    registry = DeploymentRegistry(log)
    await registry.start()
    try:
        await registry.update("m", lambda _: first_record("m", _version()))
        rival_written = False

        def add_v3(current: DeploymentRecord | None) -> DeploymentRecord:
            assert current is not None
            nonlocal rival_written
            if not rival_written:  # another gateway writes revision 2 while we compute ours
                rival_written = True
                rival = current.model_copy(
                    update={
                        "revision": current.revision + 1,
                        "written_by": "rival",
                        "versions": (*current.versions, _version("2", "p2")),
                    }
                )
                log.entries_.append(RegistryEntry(len(log.entries_), "m", rival))
            return current.model_copy(update={"versions": (*current.versions, _version("3", "p3"))})

        record = await registry.update("m", add_v3)
        assert [v.version for v in record.versions] == ["1", "2", "3"]  # the rival's kept
        assert record.revision == 3
    finally:
        await registry.stop()


async def test_update_gives_up_when_every_attempt_loses() -> None:
    log = MemoryRegistryLog()
    registry = DeploymentRegistry(log)
    await registry.start()
    try:
        await registry.update("m", lambda _: first_record("m", _version()))

        def always_beaten(current: DeploymentRecord | None) -> DeploymentRecord:
            assert current is not None  # a rival writes the next revision first, every time
            rival = current.model_copy(
                update={"revision": current.revision + 1, "written_by": "rival"}
            )
            log.entries_.append(RegistryEntry(len(log.entries_), "m", rival))
            return current.model_copy(update={"updated_at": current.updated_at + 1})

        with pytest.raises(RegistryConflict):
            await registry.update("m", always_beaten)
    finally:
        await registry.stop()


async def test_seed_registers_what_is_missing_and_leaves_what_exists() -> None:
    log = MemoryRegistryLog()
    await log.publish("a", first_record("a", _version("7", "pa")).model_copy(
        update={"written_by": "x"}
    ))  # fmt: skip
    registry = DeploymentRegistry(log)
    await registry.start()
    try:
        await registry.seed(
            [Deployment(name="a", path="/m", pool="pa"), Deployment(name="b", path="/m", pool="pb")]
        )
        a, b = registry.get("a"), registry.get("b")
        assert a is not None and [v.version for v in a.versions] == ["7"]
        assert b is not None and b.traffic.stable == "1" and b.versions[0].pool == "pb"
        await registry.seed([Deployment(name="b", path="/m", pool="pb")])  # again: no write
        assert len(log.entries_) == 2
    finally:
        await registry.stop()


async def _service(log: MemoryRegistryLog, *, bad_paths: tuple[str, ...] = ()) -> tuple[
    DeploymentsService, ModelRegistry, DeploymentRegistry
]:  # fmt: skip
    prepared: list[str] = []

    async def prepare(deployment: Deployment) -> None:
        if deployment.path in bad_paths:
            raise OSError(f"no tokenizer in {deployment.path}")
        prepared.append(deployment.ref)

    models = ModelRegistry([], ReplicaView(NoReplicas(), 1.0), prepare)  # type: ignore[arg-type]
    registry = DeploymentRegistry(log)
    registry.listen(models.apply)
    await registry.start()
    return DeploymentsService(registry, models, prepare), models, registry


async def test_put_creates_then_adds_versions_that_take_no_traffic() -> None:
    service, models, registry = await _service(MemoryRegistryLog())
    try:
        created, was_new = await service.put("org/m", _spec("1", "p1"))
        assert was_new and created.traffic.stable == "1"
        assert created.versions[0].arm == "stable" and created.versions[0].state == "loading"
        updated, was_new = await service.put("org/m", _spec("2", "p2", precision="float16"))
        assert not was_new and [v.arm for v in updated.versions] == ["stable", "none"]
        assert models.resolve("org/m").version == "1"  # the stable one
        assert models.resolve("org/m@2").pool == "p2"  # pinned
        with pytest.raises(ApiError) as missing:
            models.resolve("org/m@3")
        assert missing.value.status == 404 and missing.value.code == "model_not_found"
    finally:
        await registry.stop()


async def test_versions_are_immutable_and_a_retried_put_changes_nothing() -> None:
    log = MemoryRegistryLog()
    service, _, registry = await _service(log)
    try:
        await service.put("m", _spec("1", "p1"))
        written = len(log.entries_)
        again, was_new = await service.put("m", _spec("1", "p1"))
        assert not was_new and again.revision == 1 and len(log.entries_) == written
        with pytest.raises(ApiError) as changed:
            await service.put("m", _spec("1", "p1", max_model_len=4096))
        assert changed.value.status == 409 and changed.value.code == "version_exists"
        with pytest.raises(ApiError) as shared:
            await service.put("m", _spec("2", "p1"))
        assert shared.value.status == 409 and shared.value.code == "pool_in_use"
        assert len(log.entries_) == written
    finally:
        await registry.stop()


async def test_bad_names_and_unloadable_paths_are_refused_before_anything_is_written() -> None:
    log = MemoryRegistryLog()
    service, _, registry = await _service(log, bad_paths=("/nothing",))
    try:
        for name in ("m@2", "m:canary", "-m", ""):
            with pytest.raises(ApiError) as bad:
                await service.put(name, _spec("1", "p1"))
            assert bad.value.status == 400 and bad.value.code == "invalid_name"
        with pytest.raises(ApiError) as unloadable:
            await service.put("m", DeploymentSpec(version="1", path="/nothing", pool="p1"))
        assert unloadable.value.status == 400 and unloadable.value.param == "path"
        assert log.entries_ == []
    finally:
        await registry.stop()


async def test_an_unservable_version_is_left_out_not_the_deployment() -> None:
    models = ModelRegistry([], ReplicaView(NoReplicas(), 1.0))  # type: ignore[arg-type]

    async def refuse_v2(deployment: Deployment) -> None:
        if deployment.version == "2":
            raise OSError("gone")

    models.served._prepare = refuse_v2
    record = first_record("m", _version("1", "p1"))
    record = record.model_copy(update={"versions": (*record.versions, _version("2", "p2"))})
    await models.apply("m", record)
    assert models.resolve("m").version == "1"
    assert set(models.versions("m")) == {"1"}
    retired = record.versions[1].model_copy(update={"lifecycle": "retired"})
    await models.apply("m", record.model_copy(update={"versions": (record.versions[0], retired)}))
    with pytest.raises(ApiError):
        models.resolve("m@2")


def test_split_model() -> None:
    assert split_model("m@2") == ("m", "2")
    assert split_model("org/m@v1.5") == ("org/m", "v1.5")
    assert split_model("m") == ("m", None)
    assert split_model("m@") == ("m@", None)


def test_a_record_must_name_known_versions_once() -> None:
    from pydantic import ValidationError

    from schemas.registry import TrafficSplit

    base = first_record("m", _version("1", "p1"))
    with pytest.raises(ValidationError, match="unknown version"):
        DeploymentRecord(**{**base.model_dump(), "traffic": TrafficSplit(stable="2").model_dump()})
    with pytest.raises(ValidationError, match="twice"):
        DeploymentRecord(**{**base.model_dump(), "versions": [base.versions[0].model_dump()] * 2})
    wire = base.to_bytes()
    assert DeploymentRecord.model_validate_json(wire) == base  # JSON both ways, nothing lost


async def test_canary_promote_and_rollback_move_the_split_and_drain_what_leaves() -> None:
    service, models, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        await service.put("m", _spec("2", "p2"))
        await service.put("m", _spec("3", "p3"))
        split = await service.canary("m", "2", 20)
        assert split.traffic.canary == "2" and split.traffic.canary_percent == 20
        with pytest.raises(ApiError) as busy:
            await service.canary("m", "3", 5)
        assert busy.value.code == "canary_in_progress"
        rolled = await service.rollback("m")
        assert rolled.traffic.canary is None
        assert [v.state for v in rolled.versions] == ["loading", "draining", "loading"]
        with pytest.raises(ApiError) as drained:
            await service.canary("m", "2", 5)
        assert drained.value.code == "version_not_active"
        await service.canary("m", "3", 50)
        promoted = await service.promote("m")
        assert promoted.traffic.stable == "3" and promoted.traffic.canary is None
        assert [v.lifecycle for v in promoted.versions] == ["draining", "draining", "active"]
        assert models.resolve("m").version == "3"
        assert models.resolve("m@1").version == "1"  # draining: still pinnable
        with pytest.raises(ApiError) as none:
            await service.rollback("m")
        assert none.value.code == "no_canary"
    finally:
        await registry.stop()


async def test_a_change_of_numerics_cannot_take_canary_traffic_without_a_passing_eval() -> None:
    service, _, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        await service.put("m", _spec("fp16", "p2", precision="float16"))
        with pytest.raises(ApiError) as gated:
            await service.canary("m", "fp16", 5)
        assert gated.value.status == 409 and gated.value.code == "eval_required"
        assert "llmq eval m@fp16" in gated.value.message

        def result(passed: bool, reference: str = "1") -> EvalResult:
            scores = {"exact_match": 0.95 if passed else 0.2}
            return EvalResult(
                suite="default@1", reference=reference, passed=passed, scores=scores,
                thresholds={"exact_match": 0.8}, prompts=20, ran_at=1.0,
            )  # fmt: skip

        await service.record_evaluation("m", "fp16", result(False))
        with pytest.raises(ApiError) as failed:
            await service.canary("m", "fp16", 5)
        assert "exact_match 0.20, needs 0.80" in failed.value.message
        with pytest.raises(ApiError) as unknown:
            await service.record_evaluation("m", "fp16", result(True, reference="9"))
        assert unknown.value.code == "version_not_found"
        await service.record_evaluation("m", "fp16", result(True))
        opened = await service.canary("m", "fp16", 5)
        assert opened.traffic.canary == "fp16"
        assert [e.passed for e in opened.versions[1].evaluations] == [False, True]
    finally:
        await registry.stop()


async def test_a_failed_version_is_not_served_and_a_failed_stable_gates_nothing() -> None:
    from control.traffic import fail

    service, models, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        await registry.update("m", lambda r: fail(r, "1", 1.0, "crash loop") if r else r)
        failed = service.get("m")
        assert [(v.state, v.failure) for v in failed.versions] == [("failed", "crash loop")]
        with pytest.raises(ApiError) as gone:
            models.resolve("m@1")
        assert gone.value.code == "model_not_found"
        with pytest.raises(ApiError) as refused:
            await service.canary("m", "1", 5)
        assert refused.value.code == "version_not_active"
        # The fix loads other weights; the failed stable version cannot be evaluated
        # against, so the fix takes traffic without a suite run against it.
        await service.put("m", _spec("2", "p2", precision="float32"))
        await service.canary("m", "2", 100)
        promoted = await service.promote("m")
        assert promoted.traffic.stable == "2" and models.resolve("m").version == "2"
    finally:
        await registry.stop()


async def test_same_numerics_need_no_eval_and_each_traffic_change_is_in_the_history() -> None:
    service, _, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        await service.put("m", _spec("2", "p2"))
        auto = await service.canary("m", "2")
        assert auto.traffic.canary_percent == 5 and auto.traffic.rollout is not None
        assert auto.traffic.rollout.policy.steps == (5, 25, 100)
        await service.rollback("m")
        await service.put("m", _spec("3", "p3"))
        fixed = await service.canary("m", "3", 30)
        assert fixed.traffic.rollout is not None
        assert fixed.traffic.rollout.policy.steps == (30,)
        assert not fixed.traffic.rollout.policy.auto_promote
        done = await service.promote("m")
        assert [(e.action, e.version, e.by) for e in done.history] == [
            ("canary", "2", "operator"),
            ("rolled_back", "2", "operator"),
            ("canary", "3", "operator"),
            ("promoted", "3", "operator"),
        ]
    finally:
        await registry.stop()


async def test_the_split_sends_the_canary_its_share_and_keeps_sticky_callers_on_one_arm() -> None:
    service, models, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        await service.put("m", _spec("2", "p2"))
        await service.canary("m", "2", 20)
        arms = [models.route("m")[1] for _ in range(4000)]
        assert 0.17 < arms.count("canary") / len(arms) < 0.23
        by_user = {
            u: {models.route("m", f"user-{u}")[0].version for _ in range(5)} for u in range(200)
        }
        assert all(len(versions) == 1 for versions in by_user.values())
        on_canary = {u for u, v in by_user.items() if v == {"2"}}
        await service.canary("m", "2", 60)  # a larger share keeps everyone already on it
        assert all(models.route("m", f"user-{u}")[0].version == "2" for u in on_canary)
        assert models.route("m@1")[1] == "pinned"
    finally:
        await registry.stop()


async def test_scale_changes_only_a_live_versions_replicas() -> None:
    from schemas.deployment import ReplicaBounds

    service, _, registry = await _service(MemoryRegistryLog())
    try:
        await service.put("m", _spec("1", "p1"))
        scaled = await service.scale("m", "1", ReplicaBounds(min=3, max=4))
        assert (scaled.versions[0].replicas.min, scaled.versions[0].replicas.max) == (3, 4)
        again, _ = await service.put("m", _spec("1", "p1"))  # a retried PUT still matches
        assert again.revision == scaled.revision
        with pytest.raises(ApiError) as missing:
            await service.scale("m", "9", ReplicaBounds())
        assert missing.value.code == "version_not_found"
    finally:
        await registry.stop()
