"""The Terraform under infra/terraform, checked offline (no terraform binary): every file parses,
every variable and output is documented, the prod environment's modules exist, and the GPU node
groups keep the interface `llmq plan` writes (fleet.auto.tfvars.json) and the scheduling the
worker manifests rely on (the nvidia.com/gpu taint, the llmq.dev/pool label)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import hcl2
import pytest

TERRAFORM = Path(__file__).resolve().parents[2] / "infra" / "terraform"
PROD = TERRAFORM / "envs" / "prod"
MODULES = TERRAFORM / "modules"
MODULE_NAMES = ["network", "eks", "msk", "elasticache", "s3", "iam"]
MODULE_FILES = ["versions.tf", "variables.tf", "main.tf", "outputs.tf"]
GPU_GROUP_FIELDS = [
    "instance_type", "gpus_per_node", "tensor_parallel", "min_size", "desired_size", "max_size",
]  # fmt: skip
TF_FILES = sorted(p for p in TERRAFORM.rglob("*.tf") if ".terraform" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(TERRAFORM))


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        doc: dict[str, Any] = hcl2.load(f)
    return doc


def _text(value: Any) -> str:
    """A parsed string or expression without python-hcl2's quotes or `${...}` wrapper."""
    text = str(value).strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    if text.startswith("${") and text.endswith("}"):
        text = text[2:-1]
    return text


def _blocks(path: Path, kind: str) -> dict[str, dict[str, Any]]:
    """The `kind` blocks (variable, output, module, locals...) of one file, by label."""
    found: dict[str, dict[str, Any]] = {}
    for entry in _load(path).get(kind, []):
        for label, body in entry.items():
            found[_text(label)] = body
    return found


def _resources(path: Path, resource_type: str) -> dict[str, dict[str, Any]]:
    """The resources of one type in one file, by resource name."""
    found: dict[str, dict[str, Any]] = {}
    for entry in _load(path).get("resource", []):
        for rtype, named in entry.items():
            if _text(rtype) == resource_type:
                found.update({_text(name): body for name, body in named.items()})
    return found


def _all_blocks(kind: str) -> list[tuple[Path, str, dict[str, Any]]]:
    return [(p, label, body) for p in TF_FILES for label, body in _blocks(p, kind).items()]


def _ids(items: list[tuple[Path, str, dict[str, Any]]]) -> list[str]:
    return [f"{_rel(path)}:{label}" for path, label, _ in items]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


VARIABLES = _all_blocks("variable")
OUTPUTS = _all_blocks("output")


def test_every_module_and_the_prod_env_have_their_files() -> None:
    folders = [MODULES / name for name in MODULE_NAMES] + [PROD]
    missing = [_rel(d / f) for d in folders for f in MODULE_FILES if not (d / f).is_file()]
    assert not missing, f"missing Terraform files: {missing}"


@pytest.mark.parametrize("path", TF_FILES, ids=[_rel(p) for p in TF_FILES])
def test_every_file_parses(path: Path) -> None:
    assert isinstance(_load(path), dict)


@pytest.mark.parametrize(("path", "name", "body"), VARIABLES, ids=_ids(VARIABLES))
def test_every_variable_has_a_description_and_a_type(
    path: Path, name: str, body: dict[str, Any]
) -> None:
    assert _text(body.get("description", "")).strip(), f"{_rel(path)}: {name} has no description"
    assert _text(body.get("type", "")).strip(), f"{_rel(path)}: {name} has no type"


@pytest.mark.parametrize(("path", "name", "body"), OUTPUTS, ids=_ids(OUTPUTS))
def test_every_output_has_a_description(path: Path, name: str, body: dict[str, Any]) -> None:
    assert _text(body.get("description", "")).strip(), f"{_rel(path)}: {name} has no description"


def test_prod_module_sources_exist() -> None:
    modules = _blocks(PROD / "main.tf", "module")
    assert set(MODULE_NAMES) <= set(modules), (
        f"prod does not call: {set(MODULE_NAMES) - set(modules)}"
    )
    for name, body in modules.items():
        source = (PROD / _text(body["source"])).resolve()
        assert source.is_dir(), f"module {name}: source {source} is not a folder"
        assert (source / "main.tf").is_file(), f"module {name}: {source} has no main.tf"


def _gpu_node_group() -> dict[str, Any]:
    groups = _resources(MODULES / "eks" / "main.tf", "aws_eks_node_group")
    assert "gpu" in groups, "modules/eks has no aws_eks_node_group.gpu"
    return groups["gpu"]


def test_gpu_node_groups_are_one_per_pool_from_the_variable() -> None:
    group = _gpu_node_group()
    assert _text(group["for_each"]) == "var.gpu_node_groups"
    assert _text(group["ami_type"]) == "AL2023_x86_64_NVIDIA"
    labels = {_text(k): _text(v) for k, v in group["labels"].items()}
    assert labels["llmq.dev/pool"] == "each.key"
    assert labels["llmq.dev/role"] == "gpu-worker"
    scaling = group["scaling_config"][0]
    for field in ("min_size", "desired_size", "max_size"):
        assert _text(scaling[field]) == f"each.value.{field}"
    ignored = [_text(x) for x in group["lifecycle"][0]["ignore_changes"]]
    assert "scaling_config[0].desired_size" in ignored, "the autoscaler must own desired_size"


def test_gpu_node_groups_are_tainted_for_gpu_workers_only() -> None:
    taints = [{k: _text(v) for k, v in t.items()} for t in _gpu_node_group()["taint"]]
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NO_SCHEDULE" for t in taints), (
        taints
    )


def test_gpu_launch_template_assembles_the_nvme_raid0() -> None:
    user_data = _squash(str(_blocks(MODULES / "eks" / "main.tf", "locals")))
    for line in ("application/node.eks.aws", "kind:NodeConfig", "localStorage:", "strategy:RAID0"):
        assert line in user_data, f"the GPU nodes' NodeConfig lacks {line!r}"


def test_launch_templates_require_imdsv2_and_encrypt_the_root_volume() -> None:
    for name, template in _resources(MODULES / "eks" / "main.tf", "aws_launch_template").items():
        assert _text(template["metadata_options"][0]["http_tokens"]) == "required", name
        ebs = template["block_device_mappings"][0]["ebs"][0]
        assert ebs["encrypted"] is True, name


def _gpu_node_groups_type(path: Path) -> str:
    variable = _blocks(path, "variable").get("gpu_node_groups")
    assert variable is not None, f"{_rel(path)} does not declare gpu_node_groups"
    return _squash(_text(variable["type"]))


def test_prod_declares_the_gpu_node_groups_interface() -> None:
    declared = _gpu_node_groups_type(PROD / "variables.tf")
    assert declared.startswith("map(object({"), declared
    for field in GPU_GROUP_FIELDS:
        assert field in declared, f"gpu_node_groups lacks {field}"
    assert declared == _gpu_node_groups_type(MODULES / "eks" / "variables.tf")
    eks = _blocks(PROD / "main.tf", "module")["eks"]
    assert _text(eks["gpu_node_groups"]) == "var.gpu_node_groups"


def test_every_planned_pool_has_a_node_group_of_the_declared_shape() -> None:
    planned = json.loads((PROD / "fleet.auto.tfvars.json").read_text())["gpu_node_groups"]
    assert set(planned) == {"llama-70b", "llama-8b"}
    for pool, group in planned.items():
        assert sorted(group) == sorted(GPU_GROUP_FIELDS), pool
        assert group["min_size"] <= group["desired_size"] <= group["max_size"], pool
        assert group["gpus_per_node"] % group["tensor_parallel"] == 0, pool  # replicas fit
