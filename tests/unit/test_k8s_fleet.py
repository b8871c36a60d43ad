"""`llmq k8s render`: the fleet's objects validate against Kubernetes' and KEDA's schemas,
the committed example is what the code renders, and the scaling follows `llmq plan`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from control.k8s_fleet import Fleet, render_fleet
from control.k8s_manifests import worker_name
from llmq.cli import app
from llmq.k8s_cli import TERRAFORM_OUTPUTS, fleet_from, render_yaml

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "infra/k8s/seed-fleet.yaml"
SCHEMAS = ROOT / "infra/k8s/schemas"
KUBE_VERSION = "1.31"
CHECKOV = ROOT / ".venv-checkov/bin/checkov"


def keda_schema(kind: str) -> dict[str, Any]:
    """The `openAPIV3Schema` of KEDA's CRD for `kind` (vendored from kedacore/keda)."""
    for path in SCHEMAS.glob("keda.sh_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"no vendored CRD for {kind}")


def seed_objects() -> list[dict[str, Any]]:
    return render_fleet(fleet_from(["seed-70b", "seed-8b"], None, None))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def is_worker(deployment: dict[str, Any]) -> bool:
    return str(deployment["metadata"]["name"]).startswith("llmq-worker-")


def test_every_object_validates_against_kubernetes_or_kedas_schema() -> None:
    objects = seed_objects()
    keda = {"ScaledObject", "TriggerAuthentication"}
    for manifest in objects:
        if manifest["kind"] in keda:
            jsonschema.validate(manifest, keda_schema(manifest["kind"]))
        else:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
    assert {o["kind"] for o in objects} >= keda | {"Deployment", "Service", "NetworkPolicy"}


def test_a_bad_scaled_object_fails_the_keda_schema() -> None:
    scaled = by_kind(seed_objects(), "ScaledObject")[0]
    scaled["spec"]["triggers"][0]["metadata"] = ["not", "a", "map"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_schema("ScaledObject"))


def test_the_committed_example_is_what_llmq_renders() -> None:
    fresh = render_yaml(fleet_from(["seed-70b", "seed-8b"], None, None))
    assert EXAMPLE.read_text() == fresh, "regenerate: llmq k8s render --out " + str(EXAMPLE)


def test_each_pool_scales_on_lag_kv_and_ttft_within_its_planned_bounds() -> None:
    objects = seed_objects()
    scaled = {o["metadata"]["labels"]["llmq.dev/pool"]: o for o in by_kind(objects, "ScaledObject")}
    big = scaled["llama-70b"]["spec"]
    assert big["scaleTargetRef"]["name"] == worker_name("llama-70b", "1")
    assert (big["minReplicaCount"], big["maxReplicaCount"]) == (20, 65)  # llmq plan's bounds
    lag = {t["name"]: t["metadata"] for t in big["triggers"] if t["type"] == "kafka"}
    assert lag["interactive-lag"]["topic"] == "llmq.jobs.llama-70b.interactive"
    assert lag["batch-lag"]["topic"] == "llmq.jobs.llama-70b.batch"
    assert lag["interactive-lag"]["consumerGroup"] == "llmq.workers.llama-70b"
    # Interactive lag adds a replica per 4 waiting jobs, batch lag per 256.
    assert int(lag["interactive-lag"]["lagThreshold"]) < int(lag["batch-lag"]["lagThreshold"])
    assert lag["interactive-lag"]["saslTokenProvider"] == "aws_msk_iam"
    prometheus = {t["name"]: t for t in big["triggers"] if t["type"] == "prometheus"}
    running = prometheus["running-sequences"]  # what `llmq bench autoscale` simulates
    assert running["metricType"] == "AverageValue"
    assert running["metadata"]["threshold"] == "56"  # the plan's 55.6 per replica
    assert 'llmq_pool_kv_cache_usage{pool="llama-70b"}' in prometheus["kv-cache-use"][
        "metadata"]["query"]  # fmt: skip
    assert prometheus["ttft-p95"]["metadata"]["threshold"] == "0.8"  # 80% of the 1 s SLO
    assert big["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] >= 300  # fmt: skip


def test_workers_take_their_gpus_on_their_pools_nodes_and_drain_before_they_die() -> None:
    workers = [d for d in by_kind(seed_objects(), "Deployment") if is_worker(d)]
    assert len(workers) == 2
    for deployment in workers:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert pod["terminationGracePeriodSeconds"] > float(env["LLMQ_DRAIN_GRACE_S"])
        assert pod["nodeSelector"]["llmq.dev/pool"] in ("llama-70b", "llama-8b")
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus == (4 if pod["nodeSelector"]["llmq.dev/pool"] == "llama-70b" else 1)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
    pdbs = {p["metadata"]["name"] for p in by_kind(seed_objects(), "PodDisruptionBudget")}
    assert {w["metadata"]["name"] for w in workers} <= pdbs


def test_terraform_outputs_fill_the_fleet(tmp_path: Path) -> None:
    roles = {s: f"arn:aws:iam::1:role/{s}" for s in ("gateway", "worker", "batch", "keda")}
    values = {
        "kafka_bootstrap": "b-1.msk.example:9098", "region": "eu-west-1",
        "buckets": {"files": "f", "weights": "weights-bucket", "adapters": "a"},
        "service_role_arns": {**roles, "controller": "arn:aws:iam::1:role/controller"},
    }  # fmt: skip
    assert set(values) == set(TERRAFORM_OUTPUTS)
    outputs = {name: {"value": value, "sensitive": False} for name, value in values.items()}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    result = CliRunner().invoke(
        app, ["k8s", "render", "--preset", "seed-8b", "--terraform-output", str(path)]
    )
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.output))
    config = by_kind(objects, "ConfigMap")[0]["data"]
    assert config["LLMQ_KAFKA_BOOTSTRAP"] == "b-1.msk.example:9098"
    assert '"aws_region":"eu-west-1"' in config["LLMQ_KAFKA_CONNECTION"]
    accounts = {a["metadata"]["name"]: a for a in by_kind(objects, "ServiceAccount")}
    role = accounts["llmq-worker"]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert role == "arn:aws:iam::1:role/worker"
    worker = next(d for d in by_kind(objects, "Deployment") if is_worker(d))
    env = {e["name"]: e.get("value") for e in worker["spec"]["template"]["spec"]["containers"][
        0]["env"]}  # fmt: skip
    assert env["LLMQ_WEIGHTS_URI"] == "s3://weights-bucket/llama-8b/"
    missing = CliRunner().invoke(app, ["k8s", "render", "--terraform-output", "/nonexistent"])
    assert missing.exit_code == 1


def test_checkov_finds_nothing_in_the_rendered_fleet() -> None:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make install`"
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}
    args = [str(CHECKOV), "-f", str(EXAMPLE), "--framework", "kubernetes", "--skip-download"]
    out = subprocess.run([*args, "-o", "json"], capture_output=True, text=True, env=env,
                         timeout=600, check=False)  # fmt: skip
    report = json.loads(out.stdout)
    failed = [(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]]
    assert failed == []
    for skipped in report["results"]["skipped_checks"]:
        assert skipped["check_result"]["suppress_comment"].strip(), skipped["check_id"]


def test_the_controller_would_create_exactly_the_rendered_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller adopts the rendered worker Deployments: its LLMQ_K8S_* environment
    and the registry seeds in the ConfigMap make the very same objects."""
    from control.k8s_manifests import KubernetesSettings, worker_deployment
    from schemas.deployment import Deployment
    from schemas.registry import DeploymentVersion, spec_of

    objects = seed_objects()
    controller = next(d for d in by_kind(objects, "Deployment") if d["metadata"]["name"]
                      == "llmq-controller")  # fmt: skip
    for item in controller["spec"]["template"]["spec"]["containers"][0]["env"]:
        if item["name"].startswith("LLMQ_K8S_"):
            monkeypatch.setenv(item["name"], item["value"])
    settings = KubernetesSettings()
    config = by_kind(objects, "ConfigMap")[0]["data"]
    seeds = [Deployment.model_validate(d) for d in json.loads(config["LLMQ_DEPLOYMENTS"])]
    rendered = {d["metadata"]["name"]: d for d in by_kind(objects, "Deployment") if is_worker(d)}
    assert len(seeds) == len(rendered) == 2
    for seed in seeds:
        version = DeploymentVersion(**spec_of(seed).model_dump(), created_at=0)
        made = worker_deployment(seed.name, version, settings, {}, replicas=version.replicas.min)
        ours = rendered[made["metadata"]["name"]]
        annotations = dict(ours["metadata"]["annotations"])
        assert {k for k in annotations if not k.startswith("checkov.io/")} == set(
            made["metadata"]["annotations"]
        )
        ours = {**ours, "metadata": {**ours["metadata"], "annotations": made["metadata"][
            "annotations"]}}  # fmt: skip
        assert ours == made


def test_a_fleet_whose_topics_cannot_reach_a_pools_maximum_is_refused() -> None:
    fleet = fleet_from(["seed-70b"], None, None)
    with pytest.raises(ValueError, match="partitions"):
        Fleet.model_validate({**fleet.model_dump(), "job_topic_partitions": 64})  # max 65


def test_prometheus_may_scrape_every_process_that_serves_metrics_and_nothing_more() -> None:
    objects = seed_objects()
    for deployment in by_kind(objects, "Deployment"):
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        if name == "llmq-controller":  # serves probes only
            assert "prometheus.io/scrape" not in annotations
            continue
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports, name
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    (rule,) = policies["llmq-metrics-scrape"]["ingress"]
    assert rule["ports"] == [{"port": 8081, "protocol": "TCP"}]  # the probe port alone
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
