"""The worker manifests: valid against the Kubernetes OpenAPI schema (offline, strict: an
unknown or misplaced field fails), and saying what the workers need."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from control.k8s_manifests import (
    GPU_RESOURCE,
    WEIGHTS_MOUNT,
    KubernetesSettings,
    label_value,
    version_env,
    worker_deployment,
    worker_name,
    worker_pdb,
)
from llmq.controller import ControllerSettings, LocalProcessReplicas
from schemas.registry import DeploymentVersion

KUBE_VERSION = "1.31"
"""The oldest Kubernetes the manifests must be valid for (the schema of that minor)."""
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LLAMA = "meta-llama/Llama-3.1-70B-Instruct"
BASE_ENV = {"LLMQ_KAFKA_BOOTSTRAP": "kafka:9092", "LLMQ_PROBE_PORT": "1", "LLMQ_LOG_JSON": "false"}


def _version(tp: int = 1, **update: Any) -> DeploymentVersion:
    fields: dict[str, Any] = {
        "version": "2", "path": "/models/llama", "pool": "h200-tp4", "created_at": 1,
        "tensor_parallel_size": tp, "max_model_len": 8192,
    }  # fmt: skip
    return DeploymentVersion(**{**fields, **update})


SETTINGS = [
    KubernetesSettings(),
    KubernetesSettings(weight_cache="hostPath", host_path="/mnt/nvme0/weights"),
    KubernetesSettings(gpu=False, service_account="llmq-worker", image_pull_policy="Always"),
]


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _pod(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(deployment)["env"]}


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("tp", [1, 4])
def test_deployment_and_pdb_validate_against_the_kubernetes_schema(
    settings: KubernetesSettings, tp: int
) -> None:
    deployment = worker_deployment(LLAMA, _version(tp), settings, BASE_ENV)
    assert kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True) == KUBE_VERSION
    pdb = worker_pdb(LLAMA, _version(tp), settings)
    assert kubernetes_validate.validate(pdb, KUBE_VERSION, strict=True) == KUBE_VERSION
    latest = kubernetes_validate.latest_version()
    kubernetes_validate.validate(deployment, latest, strict=True)
    kubernetes_validate.validate(pdb, latest, strict=True)


def test_the_schema_check_rejects_a_wrong_manifest() -> None:
    deployment = worker_deployment(LLAMA, _version(), KubernetesSettings())
    _container(deployment)["readinessProbe"]["httpGet"]["paths"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
    deployment = worker_deployment(LLAMA, _version(), KubernetesSettings())
    deployment["spec"]["replicas"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpus_follow_the_tensor_parallel_size(tp: int) -> None:
    deployment = worker_deployment(LLAMA, _version(tp), KubernetesSettings())
    resources = _container(deployment)["resources"]
    assert resources["limits"] == {GPU_RESOURCE: str(tp)}
    assert resources["requests"] == {GPU_RESOURCE: str(tp)}
    tolerations = _pod(deployment)["tolerations"]
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    shm = [v for v in _pod(deployment)["volumes"] if v.get("emptyDir", {}).get("medium")]
    assert len(shm) == (1 if tp > 1 else 0)


def test_cpu_workers_ask_for_no_gpu() -> None:
    pod = _pod(worker_deployment(LLAMA, _version(4), KubernetesSettings(gpu=False)))
    assert "resources" not in pod["containers"][0]
    assert "tolerations" not in pod
    assert GPU_RESOURCE not in str(pod)


@pytest.mark.parametrize("drain", [1.0, 60.0, 600.5])
def test_the_termination_grace_outlasts_the_drain(drain: float) -> None:
    settings = KubernetesSettings(drain_grace_s=drain)
    deployment = worker_deployment(LLAMA, _version(), settings)
    grace = _pod(deployment)["terminationGracePeriodSeconds"]
    assert isinstance(grace, int) and grace >= drain + 30
    assert float(_env(deployment)["LLMQ_DRAIN_GRACE_S"]) == drain  # the worker drains that long


@pytest.mark.parametrize(
    ("name", "version"),
    [
        (LLAMA, "2"),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8-with-a-much-longer-suffix", "2025-06-01.rc1"),
        ("a" * 128, "B" * 63),
        ("Org_X/Model.v2", "v1.0_final-"),
    ],
)
def test_names_and_labels_are_valid_and_short(name: str, version: str) -> None:
    deployment = worker_deployment(name, _version(version=version), KubernetesSettings())
    object_name = deployment["metadata"]["name"]
    assert object_name == worker_name(name, version)
    assert len(object_name) <= 63 and DNS_LABEL.match(object_name), object_name
    assert object_name.startswith("llmq-worker-")
    template = deployment["spec"]["template"]["metadata"]
    for labels in (deployment["metadata"]["labels"], template["labels"]):
        for value in labels.values():
            assert len(value) <= 63 and LABEL_VALUE.match(value), value
    assert deployment["metadata"]["annotations"] == {
        "llmq.dev/deployment": name,
        "llmq.dev/version": version,
    }


def test_a_hugging_face_name_reads_well() -> None:
    name = worker_name(LLAMA, "2")
    assert re.fullmatch(r"llmq-worker-meta-llama-llama-3-1-70b-instruct-2-[0-9a-f]{8}", name)
    assert label_value(LLAMA) == "meta-llama_Llama-3.1-70B-Instruct"
    assert label_value("smollm2") == "smollm2"


def test_names_that_slug_alike_stay_apart() -> None:
    names = {
        worker_name(*pair)
        for pair in [("a/b", "c"), ("a-b", "c"), ("a", "b-c"), ("A.B", "c"), ("a_b", "C")]
    }
    assert len(names) == 5
    assert worker_name("x" * 128, "1") != worker_name("x" * 127, "1")
    assert label_value("x" * 100) != label_value("x" * 99)


def test_labels_select_the_version_and_nodes_of_its_pool() -> None:
    deployment = worker_deployment(LLAMA, _version(), KubernetesSettings())
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "llmq-worker"
    assert labels["app.kubernetes.io/managed-by"] == "llmq-controller"
    assert labels["llmq.dev/version"] == "2" and labels["llmq.dev/pool"] == "h200-tp4"
    selector = deployment["spec"]["selector"]["matchLabels"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert worker_pdb(LLAMA, _version(), KubernetesSettings())["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector},
    }
    other = worker_deployment(LLAMA, _version(version="3"), KubernetesSettings())
    assert other["spec"]["selector"]["matchLabels"] != selector  # one version's pods only
    assert _pod(deployment)["nodeSelector"] == {"llmq.dev/pool": "h200-tp4"}


@pytest.mark.parametrize("port", [8081, 9400])
def test_probes_point_at_the_probe_port(port: int) -> None:
    container = _container(
        worker_deployment(LLAMA, _version(), KubernetesSettings(probe_port=port))
    )
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert container["ports"][0]["containerPort"] == port
    env = _env(worker_deployment(LLAMA, _version(), KubernetesSettings(probe_port=port)))
    assert env["LLMQ_PROBE_PORT"] == str(port) and env["LLMQ_PROBE_HOST"] == "0.0.0.0"


def test_the_environment_is_the_versions_plus_the_pods() -> None:
    version = _version(
        tp=4, tpot_slo_s=0.05, engine_args={"max_num_seqs": 64, "enforce_eager": True},
        weights_uri="s3://models/llama", sha256="ab" * 32,
    )  # fmt: skip
    deployment = worker_deployment(LLAMA, version, KubernetesSettings(), BASE_ENV)
    env = _env(deployment)
    assert env["LLMQ_KAFKA_BOOTSTRAP"] == "kafka:9092"  # every worker's
    assert env["LLMQ_MODEL"] == LLAMA and env["LLMQ_MODEL_PATH"] == "/models/llama"
    assert env["LLMQ_POOL"] == "h200-tp4" and env["LLMQ_MAX_MODEL_LEN"] == "8192"
    assert env["LLMQ_DTYPE"] == "bfloat16" and env["LLMQ_TPOT_SLO_S"] == "0.05"
    assert env["LLMQ_MAX_NUM_SEQS"] == "64" and "LLMQ_ENFORCE_EAGER" not in env
    assert env["LLMQ_WEIGHTS_URI"] == "s3://models/llama"
    assert env["LLMQ_WEIGHTS_SHA256"] == "ab" * 32
    assert env["LLMQ_PROBE_PORT"] == "8081" and env["LLMQ_LOG_JSON"] == "true"  # the pod's win
    assert env["LLMQ_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    names = [e["name"] for e in _container(deployment)["env"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("cache", ["emptyDir", "hostPath"])
def test_the_weight_cache_volume(cache: str) -> None:
    settings = KubernetesSettings(weight_cache=cache, host_path="/mnt/nvme0/weights")
    deployment = worker_deployment(LLAMA, _version(), settings)
    [volume] = [v for v in _pod(deployment)["volumes"] if v["name"] == "weights"]
    if cache == "hostPath":
        assert volume["hostPath"] == {"path": "/mnt/nvme0/weights", "type": "DirectoryOrCreate"}
    else:
        assert volume == {"name": "weights", "emptyDir": {}}
    mounts = _container(deployment)["volumeMounts"]
    assert {"name": "weights", "mountPath": WEIGHTS_MOUNT} in mounts
    assert _env(deployment)["LLMQ_WEIGHTS_CACHE_DIR"] == WEIGHTS_MOUNT


def test_the_local_adapter_builds_the_same_environment() -> None:
    settings = ControllerSettings(worker_env={"LLMQ_KAFKA_BOOTSTRAP": "127.0.0.1:9092"})
    version = _version(engine_args={"kv_cache_gib": 2})
    env = LocalProcessReplicas(settings).worker_env(LLAMA, version, "h200-tp4-dev-0")
    assert env == {
        **version_env(LLAMA, version, settings.worker_env),
        "LLMQ_REPLICA_ID": "h200-tp4-dev-0",
    }
    assert env["LLMQ_KV_CACHE_GIB"] == "2" and env["LLMQ_KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"
