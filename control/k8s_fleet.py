"""`llmq k8s render`: every Kubernetes object of an llmq fleet on EKS, from one typed input.

The gateway (`Deployment`, `Service`, `PodDisruptionBudget`, a CPU `HorizontalPodAutoscaler`),
the batch service, and per model pool its workers' `Deployment` and `PodDisruptionBudget` (the
very objects the pool controller's Kubernetes adapter creates, `control.k8s_manifests`) with a
KEDA `ScaledObject` (`control.keda`). Service accounts carry the IRSA roles Terraform made;
every process reads the same `llmq-config` ConfigMap and the Redis URL (it holds the auth
token) from the `llmq-redis` Secret, which the operator creates (see the README's Deploy).

Pure code: renders dicts, talks to nothing.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, PositiveInt, model_validator

from control.k8s_manifests import (
    KubernetesSettings,
    Manifest,
    worker_deployment,
    worker_name,
    worker_pdb,
)
from control.k8s_pods import (
    CONFIG_MAP,
    REDIS_SECRET,
    env_from,
    labels,
    pod_spec,
    process,
    skips,
    workload,
)
from control.k8s_rbac import CONTROLLER_ACCOUNT, controller_rbac
from control.keda import KafkaAccess, msk_trigger_authentication, scaled_object, version_scaling
from schemas.deployment import Deployment, ReplicaBounds
from schemas.registry import DeploymentVersion
from topics.kafka_connection import KafkaConnection

GATEWAY_PORT = 8000
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
TOKENIZERS = "/models"
"""Where the gateway and batch pods keep each deployment's tokenizer (`<path>/<name>`)."""
PROBE_PORT = 8081
"""The batch service's and the controller's `/healthz` and `/readyz`."""


class FleetPool(BaseModel):
    """One model pool: its deployment's first version and its scaling bounds."""

    deployment: str
    version: str = "1"
    pool: str
    weights_uri: str
    """Where the weights are (`s3://<weights bucket>/<model>/`)."""
    path: str = "/var/cache/llmq/weights/model"
    tensor_parallel: PositiveInt
    max_model_len: PositiveInt = 8192
    ttft_slo_s: float = Field(gt=0)
    tpot_slo_s: float | None = None
    min_replicas: int = Field(ge=0)
    max_replicas: PositiveInt
    target_sequences: float | None = Field(default=None, gt=0)
    """Running sequences per replica KEDA aims at (the plan's `sequences_per_replica`)."""


class Fleet(BaseModel):
    """What the fleet's objects are rendered from; Terraform's outputs fill most of it."""

    namespace: str = "llmq"
    image: str = "ghcr.io/llmq/llmq:0.1.0"
    """The one llmq image (`llmq gateway`, `llmq worker`, `llmq batch serve`)."""
    aws_region: str = "us-east-1"
    kafka_bootstrap: str
    """MSK's IAM bootstrap brokers (terraform output `msk_bootstrap_brokers_sasl_iam`)."""
    files_bucket: str
    adapters_bucket: str
    gateway_role_arn: str
    worker_role_arn: str
    batch_role_arn: str
    keda_role_arn: str
    controller_role_arn: str
    job_topic_partitions: PositiveInt = 128
    """Partitions of every job topic the controller creates: at least any pool's
    `max_replicas` (KEDA never runs more consumers than partitions)."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    monitoring_namespace: str = "monitoring"
    """Where Prometheus runs: its pods may scrape the workers' and batch services' probe
    ports (`/metrics`), which nothing else may reach."""
    gateway_replicas: PositiveInt = 3
    gateway_max_replicas: PositiveInt = 12
    weight_cache_path: str = "/mnt/k8s-disks/0/llmq/weights"
    """The node's NVMe RAID0 (nodeadm `localStorage`) where workers cache weights."""
    drain_grace_s: float = 120.0
    pools: list[FleetPool]

    @model_validator(mode="after")
    def _partitions_cover_the_pools(self) -> Fleet:
        widest = max((p.max_replicas for p in self.pools), default=0)
        if widest > self.job_topic_partitions:
            raise ValueError(
                f"job_topic_partitions {self.job_topic_partitions} is below a pool's "
                f"max_replicas {widest}: KEDA never runs more consumers than partitions"
            )
        return self


def _meta(name: str, fleet: Fleet, **extra: Any) -> Manifest:
    return {"name": name, "namespace": fleet.namespace, **extra}


def _service_account(name: str, role_arn: str, fleet: Fleet) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, fleet, annotations={ROLE_ANNOTATION: role_arn}),
    }


def _config(fleet: Fleet) -> Manifest:
    """What every llmq process shares (MSK over TLS with IAM, the buckets, JSON logs)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(CONFIG_MAP, fleet),
        "data": {
            "LLMQ_KAFKA_BOOTSTRAP": fleet.kafka_bootstrap,
            "LLMQ_KAFKA_CONNECTION": KafkaConnection(
                security_protocol="SASL_SSL",
                sasl_mechanism="OAUTHBEARER",
                aws_region=fleet.aws_region,
                replication_factor=3,
            ).model_dump_json(),
            "AWS_REGION": fleet.aws_region,
            "LLMQ_S3_BUCKET": fleet.files_bucket,
            "LLMQ_ADAPTER_URI_PREFIX": f"s3://{fleet.adapters_bucket}/{{team}}/",
            "LLMQ_LOG_JSON": "true",
            "LLMQ_JOB_TOPIC_PARTITIONS": str(fleet.job_topic_partitions),
            "LLMQ_DEPLOYMENTS": json.dumps(
                [seed(p).model_dump(mode="json", exclude_defaults=True) for p in fleet.pools]
            ),
        },
    }


def _tokenizer_pulls(fleet: Fleet) -> list[Manifest]:
    """Init containers that pull each deployment's tokenizer (not its weights) into the pod:
    the gateway and the batch service tokenize prompts themselves."""
    return [
        {
            "name": f"tokenizer-{i}",
            "image": fleet.image,
            "command": ["llmq", "weights", "pull", "--tokenizer-only", p.weights_uri,
                        tokenizer_path(p)],
            "envFrom": env_from(),
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                          "limits": {"memory": "512Mi"}},
        }
        for i, p in enumerate(fleet.pools)
    ]  # fmt: skip


def _gateway(fleet: Fleet) -> list[Manifest]:
    """The gateways: stateless, as many as connections need (a CPU autoscaler)."""
    container = process(
        "gateway", fleet.image, ["llmq", "gateway"],
        {"LLMQ_HOST": "0.0.0.0", "LLMQ_PORT": str(GATEWAY_PORT), "LLMQ_ROUTING": "affinity"},
        port=("http", GATEWAY_PORT), cpu="2", memory="4Gi",
    )  # fmt: skip
    pod = pod_spec(
        "llmq-gateway", container, init=_tokenizer_pulls(fleet), volumes={"models": TOKENIZERS},
        terminationGracePeriodSeconds=60,  # streams in flight finish before it exits
    )  # fmt: skip
    selected = labels("llmq-gateway")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("llmq-gateway", fleet, labels=selected),
        "spec": {
            "selector": selected,
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta("llmq-gateway", fleet, labels=selected),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selected}},
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta("llmq-gateway", fleet, labels=selected),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": "llmq-gateway"},
            "minReplicas": fleet.gateway_replicas,
            "maxReplicas": max(fleet.gateway_max_replicas, fleet.gateway_replicas),
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": 60}}}],
        },
    }  # fmt: skip
    deployment = workload("llmq-gateway", fleet.namespace, pod, replicas=fleet.gateway_replicas,
                          metrics_port=GATEWAY_PORT)  # fmt: skip
    return [deployment, service, pdb, hpa]


def _batch_service(fleet: Fleet) -> Manifest:
    container = process(
        "batch", fleet.image, ["llmq", "batch", "serve"],
        {"LLMQ_PROBE_PORT": str(PROBE_PORT), "LLMQ_PROBE_HOST": "0.0.0.0"},
        port=("probes", PROBE_PORT), cpu="1", memory="2Gi",
    )  # fmt: skip
    pod = pod_spec(
        "llmq-batch", container, init=_tokenizer_pulls(fleet), volumes={"models": TOKENIZERS}
    )
    return workload("llmq-batch", fleet.namespace, pod, metrics_port=PROBE_PORT)


def _network_policies(fleet: Fleet) -> list[Manifest]:
    """Nothing reaches llmq's pods but the gateway's port (workers and the batch service
    only call out: to MSK, Redis, S3) and, from Prometheus's namespace, the probe port that
    serves their `/metrics`; kubelet probes are not subject to policies."""
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("default-deny-ingress", fleet),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }
    gateway = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("llmq-gateway-ingress", fleet),
        "spec": {
            "podSelector": {"matchLabels": labels("llmq-gateway")},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": GATEWAY_PORT, "protocol": "TCP"}]}],
        },
    }
    scrape = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("llmq-metrics-scrape", fleet),
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": fleet.monitoring_namespace}}}],
                "ports": [{"port": PROBE_PORT, "protocol": "TCP"}],
            }],
        },
    }  # fmt: skip
    return [deny, gateway, scrape]


def pool_version(pool: FleetPool) -> DeploymentVersion:
    """A pool's deployment version as the registry holds it once seeded."""
    return DeploymentVersion(**seed(pool).model_dump(exclude={"name"}), created_at=0)


def seed(pool: FleetPool) -> Deployment:
    """A pool's deployment as `LLMQ_DEPLOYMENTS` seeds the registry with (version "1"): the
    gateways, the batch service and the controller agree on it from their first start."""
    return Deployment(
        name=pool.deployment, version=pool.version, path=tokenizer_path(pool),
        weights_uri=pool.weights_uri, tensor_parallel_size=pool.tensor_parallel,
        max_model_len=pool.max_model_len, pool=pool.pool, ttft_slo_s=pool.ttft_slo_s,
        tpot_slo_s=pool.tpot_slo_s,
        replicas=ReplicaBounds(
            min=pool.min_replicas, max=pool.max_replicas,
            target_sequences=pool.target_sequences,
        ),
    )  # fmt: skip


def tokenizer_path(pool: FleetPool) -> str:
    """Where a gateway finds a pool's tokenizer (pulled from its weights by an init container;
    workers load the weights themselves from `weights_uri`)."""
    return f"{TOKENIZERS}/{pool.deployment}"


def worker_settings(fleet: Fleet) -> KubernetesSettings:
    """How the workers run, for the rendered Deployments and for the controller, which
    creates the next versions' (its `LLMQ_K8S_*` environment): the same objects either way."""
    return KubernetesSettings(
        namespace=fleet.namespace, image=fleet.image, image_pull_policy="Always",
        service_account="llmq-worker", weight_cache="hostPath",
        host_path=fleet.weight_cache_path, drain_grace_s=fleet.drain_grace_s,
        cpu_per_gpu=8, memory_gib_per_gpu=64, config_map=CONFIG_MAP, redis_secret=REDIS_SECRET,
        autoscaler="keda", keda_kafka_bootstrap=fleet.kafka_bootstrap,
        keda_aws_region=fleet.aws_region, prometheus_url=fleet.prometheus_url,
    )  # fmt: skip


def _workers(fleet: Fleet, pool: FleetPool, settings: KubernetesSettings) -> list[Manifest]:
    """A pool's first version: what the controller would create (it adopts these)."""
    version = pool_version(pool)
    deployment = worker_deployment(
        pool.deployment, version, settings, {}, replicas=pool.min_replicas
    )
    deployment["metadata"]["annotations"].update(skips())
    kafka = KafkaAccess(bootstrap_servers=fleet.kafka_bootstrap, aws_region=fleet.aws_region)
    name = worker_name(pool.deployment, pool.version)
    scaling = version_scaling(pool.deployment, version)
    return [
        deployment,
        worker_pdb(pool.deployment, version, settings),
        scaled_object(name, fleet.namespace, scaling, kafka, fleet.prometheus_url),
    ]


def _controller(fleet: Fleet, settings: KubernetesSettings) -> list[Manifest]:
    """The pool controller (one replica): rollouts, warm floors, drains, on the cluster."""
    env = {"LLMQ_REPLICA_RUNNER": "kubernetes", "LLMQ_PROBE_PORT": str(PROBE_PORT),
           "LLMQ_PROBE_HOST": "0.0.0.0"}  # fmt: skip
    env.update(
        (f"LLMQ_K8S_{key.upper()}", str(value))
        for key, value in settings.model_dump(exclude_none=True).items()
    )
    container = process(
        "controller", fleet.image, ["llmq", "controller"], env,
        port=("probes", PROBE_PORT), cpu="500m", memory="1Gi",
    )  # fmt: skip
    pod = pod_spec(CONTROLLER_ACCOUNT, container, role="system", api_token=True)
    deployment = workload(
        CONTROLLER_ACCOUNT, fleet.namespace, pod,
        accepted={"CKV_K8S_38": "the controller calls the Kubernetes API (its Role: workers)"},
        strategy={"type": "Recreate"},  # never two controllers at once
    )  # fmt: skip
    account, role, binding = controller_rbac(settings)
    account["metadata"].setdefault("annotations", {})[ROLE_ANNOTATION] = fleet.controller_role_arn
    return [account, role, binding, deployment]


def render_fleet(fleet: Fleet) -> list[Manifest]:
    """Every object, in the order `kubectl apply` should create them."""
    settings = worker_settings(fleet)
    objects: list[Manifest] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fleet.namespace}},
        _service_account("llmq-gateway", fleet.gateway_role_arn, fleet),
        _service_account("llmq-worker", fleet.worker_role_arn, fleet),
        _service_account("llmq-batch", fleet.batch_role_arn, fleet),
        _config(fleet),
        *_network_policies(fleet),
        msk_trigger_authentication(fleet.namespace, fleet.keda_role_arn),
        *_gateway(fleet),
        _batch_service(fleet),
        *_controller(fleet, settings),
    ]
    for pool in fleet.pools:
        objects += _workers(fleet, pool, settings)
    return objects
