"""Teams' LoRA adapters: registration rules, visibility, resolution of adapter names, and
their records in the registry log (over the in-memory log)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control.registry import DeploymentRegistry, first_record
from gateway.auth import Caller, Team
from gateway.errors import ApiError
from gateway.s3_adapter_files import read_adapter_config
from gateway.services.adapters import AdapterFiles, AdapterFilesError, AdaptersService
from gateway.services.registry import ModelRegistry, ReplicaView
from schemas.adapters import AdapterRecord, AdapterSpec, adapter_key
from schemas.deployment import Deployment
from schemas.registry import DeploymentVersion
from tests.unit.test_registry import MemoryRegistryLog, NoReplicas

SHA = "a" * 64
OTHER_SHA = "b" * 64
TEAM_A = Caller(team=Team("team-a"))
TEAM_B = Caller(team=Team("team-b"))
ADMIN = Caller(team=None)


class FolderStore:
    """What `inspect` finds at each uri: (digest, rank), or an error code."""

    def __init__(self) -> None:
        self.folders: dict[str, tuple[str, int]] = {"s3://w/signoff": (SHA, 8)}
        self.inspected: list[str] = []

    async def inspect(self, uri: str, sha256: str) -> AdapterFiles:
        self.inspected.append(uri)
        if uri not in self.folders:
            raise AdapterFilesError("weights_unreachable", f"no weights under {uri}")
        digest, rank = self.folders[uri]
        if digest != sha256:
            raise AdapterFilesError("sha256_mismatch", f"{uri} does not match its sha256")
        return AdapterFiles(rank=rank, target_modules=("q_proj", "v_proj"))


def _base(name: str = "base", max_lora_rank: int | None = 8) -> DeploymentVersion:
    args = {"max_lora_rank": max_lora_rank} if max_lora_rank is not None else {}
    return DeploymentVersion(version="1", path="/m", pool=name, created_at=1, engine_args=args)


@pytest.fixture
async def registry() -> AsyncIterator[DeploymentRegistry]:
    log = MemoryRegistryLog()
    await log.publish("base", first_record("base", _base()))
    await log.publish("plain", first_record("plain", _base("plain", None)))
    registry = DeploymentRegistry(log)  # type: ignore[arg-type]
    await registry.start()
    yield registry
    await registry.stop()


def _service(registry: DeploymentRegistry, store: FolderStore | None = None) -> AdaptersService:
    teams = {"team-a", "team-b"}
    return AdaptersService(registry, store or FolderStore(), teams.__contains__, now=lambda: 100)


def _spec(**fields: object) -> AdapterSpec:
    values: dict[str, object] = {"base": "base", "weights_uri": "s3://w/signoff", "sha256": SHA,
                                 "rank": 8, **fields}  # fmt: skip
    return AdapterSpec.model_validate(values)


async def _refused(call: object) -> ApiError:
    with pytest.raises(ApiError) as refused:
        await call  # type: ignore[misc]
    return refused.value


async def test_a_team_registers_sees_and_deletes_its_own_adapter(
    registry: DeploymentRegistry,
) -> None:
    service = _service(registry)
    adapter, created = await service.put(TEAM_A, "signoff", _spec())
    assert created and adapter.owned_by == "team-a" and adapter.status == "ready"
    again, created_again = await service.put(TEAM_A, "signoff", _spec())
    assert not created_again and again == adapter  # a retried PUT changes nothing
    record = registry.adapter("team-a", "signoff")
    assert record is not None and record.revision == 1
    assert [a.id for a in service.list(TEAM_A).data] == ["signoff"]
    assert service.list(TEAM_B).data == []
    assert (await _refused(_async(service.get, TEAM_B, "signoff"))).status == 404
    deleted = await service.delete(TEAM_A, "signoff")
    assert deleted.deleted and registry.adapter("team-a", "signoff") is None
    assert (await _refused(service.delete(TEAM_A, "signoff"))).status == 404


async def _async(function: object, *args: object) -> object:
    return function(*args)  # type: ignore[operator]


async def test_two_teams_may_each_have_an_adapter_of_one_name(
    registry: DeploymentRegistry,
) -> None:
    service = _service(registry)
    await service.put(TEAM_A, "helper", _spec())
    await service.put(TEAM_B, "helper", _spec())
    assert {r.key for r in registry.adapters} == {
        adapter_key("team-a", "helper"),
        adapter_key("team-b", "helper"),
    }
    await service.delete(TEAM_B, "helper")
    assert registry.adapter("team-a", "helper") is not None


@pytest.mark.parametrize(
    ("fields", "status", "code"),
    [
        ({"base": "nope"}, 400, "unknown_base"),
        ({"base": "plain"}, 400, "lora_not_enabled"),
        ({"rank": 16}, 400, "rank_too_large"),
        ({"rank": 4}, 400, "rank_mismatch"),
        ({"sha256": OTHER_SHA}, 400, "sha256_mismatch"),
        ({"weights_uri": "s3://w/missing"}, 400, "weights_unreachable"),
        ({"team": "team-b"}, 403, "permission_denied"),
    ],
)
async def test_bad_registrations_are_refused_before_anything_is_written(
    registry: DeploymentRegistry, fields: dict[str, object], status: int, code: str
) -> None:
    refused = await _refused(_service(registry).put(TEAM_A, "signoff", _spec(**fields)))
    assert (refused.status, refused.code) == (status, code)
    assert registry.adapters == []


async def test_names_are_checked_against_deployments_and_the_pattern(
    registry: DeploymentRegistry,
) -> None:
    service = _service(registry)
    assert (await _refused(service.put(TEAM_A, "base", _spec()))).code == "name_in_use"
    assert (await _refused(service.put(TEAM_A, "a:b", _spec()))).code == "invalid_name"


async def test_an_admin_registers_for_a_named_known_team_and_sees_every_team(
    registry: DeploymentRegistry,
) -> None:
    service = _service(registry)
    assert (await _refused(service.put(ADMIN, "x", _spec()))).param == "team"
    assert (await _refused(service.put(ADMIN, "x", _spec(team="ghosts")))).code == "unknown_team"
    await service.put(ADMIN, "x", _spec(team="team-b"))
    await service.put(TEAM_A, "y", _spec())
    assert [(a.owned_by, a.id) for a in service.list(ADMIN).data] == [
        ("team-a", "y"),
        ("team-b", "x"),
    ]
    assert [a.id for a in service.list(ADMIN, "team-b").data] == ["x"]
    assert service.get(TEAM_B, "x").owned_by == "team-b"


async def test_a_load_failure_marks_only_the_weights_that_failed(
    registry: DeploymentRegistry,
) -> None:
    store = FolderStore()
    store.folders["s3://w/v2"] = (OTHER_SHA, 8)
    service = _service(registry, store)
    await service.put(TEAM_A, "signoff", _spec())
    await service.mark_failed("team-a", "signoff", OTHER_SHA, "not these weights")
    assert service.get(TEAM_A, "signoff").status == "ready"
    await service.mark_failed("team-a", "signoff", SHA, "size mismatch for lora_A")
    failed = service.get(TEAM_A, "signoff")
    assert failed.status == "failed" and failed.failure == "size mismatch for lora_A"
    replaced, _ = await service.put(
        TEAM_A, "signoff", _spec(weights_uri="s3://w/v2", sha256=OTHER_SHA)
    )
    assert replaced.status == "ready" and replaced.failure is None


async def test_adapter_names_resolve_per_team_to_the_base_stable_version(
    registry: DeploymentRegistry,
) -> None:
    await _service(registry).put(TEAM_A, "signoff", _spec())
    models = ModelRegistry(
        [Deployment(name="base", path="/m", pool="base")],
        ReplicaView(NoReplicas(), 1.0),  # type: ignore[arg-type]
        adapters=registry,
    )
    route = models.route_for("team-a", "signoff")
    assert route.deployment.name == "base" and route.arm == "stable"
    assert route.adapter is not None and route.adapter.id == "team-a/signoff"
    assert route.adapter.sha256 == SHA
    assert models.route_for("team-a", "base").adapter is None
    with pytest.raises(ApiError) as other_team:
        models.route_for("team-b", "signoff")
    assert other_team.value.status == 404 and other_team.value.code == "model_not_found"
    await _service(registry).mark_failed("team-a", "signoff", SHA, "bad tensors")
    with pytest.raises(ApiError) as failed:
        models.route_for("team-a", "signoff")
    assert failed.value.status == 400 and failed.value.code == "adapter_failed"


async def test_the_fold_skips_a_record_filed_under_another_key(
    registry: DeploymentRegistry,
) -> None:
    log = registry._log  # the test writes the log as a foreign writer would
    record = AdapterRecord(name="x", team="team-a", base="base", weights_uri="s3://w/x",
                           sha256=SHA, rank=8, created_at=1)  # fmt: skip
    offset = await log.publish(adapter_key("team-b", "x"), record)
    await log.publish("x", record)  # an adapter under a deployment's key
    await registry.wait_folded(offset + 1)
    assert registry.adapters == [] and registry.get("x") is None


@pytest.mark.parametrize(
    ("config", "accepted"),
    [
        ({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}, True),
        ({"peft_type": "LORA", "r": 8, "target_modules": "q_proj"}, True),
        ({"peft_type": "PREFIX_TUNING", "r": 8}, False),
        ({"peft_type": "LORA", "r": 0}, False),
        ({"peft_type": "LORA"}, False),
        (None, False),
    ],
)
def test_an_adapter_folder_must_hold_a_lora_config_with_a_rank(
    tmp_path: Path, config: dict[str, object] | None, accepted: bool
) -> None:
    if config is not None:
        (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    if accepted:
        files = read_adapter_config(tmp_path)
        assert files.rank == 8 and "q_proj" in files.target_modules
    else:
        with pytest.raises(AdapterFilesError) as refused:
            read_adapter_config(tmp_path)
        assert refused.value.code == "invalid_adapter"


async def test_with_a_uri_prefix_a_team_registers_only_under_its_own(
    registry: DeploymentRegistry,
) -> None:
    store = FolderStore()
    store.folders["s3://w/team-a/signoff"] = (SHA, 8)
    service = AdaptersService(
        registry, store, {"team-a", "team-b"}.__contains__, uri_prefix="s3://w/{team}/"
    )
    for uri in ("s3://w/signoff", "s3://w/team-b/signoff", "s3://w/team-a/../team-b/x"):
        refused = await _refused(service.put(TEAM_A, "x", _spec(weights_uri=uri)))
        assert (refused.status, refused.code) == (400, "weights_uri_not_allowed")
    assert store.inspected == []  # refused before anything was fetched
    adapter, _ = await service.put(TEAM_A, "x", _spec(weights_uri="s3://w/team-a/signoff"))
    assert adapter.weights_uri == "s3://w/team-a/signoff"
