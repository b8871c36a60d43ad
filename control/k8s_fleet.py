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

from typing import Any

from pydantic import BaseModel, Field, PositiveInt

from control.k8s_manifests import (
    CONTAINER_SECURITY,
    POD_SECURITY,
    KubernetesSettings,
    Manifest,
    worker_deployment,
    worker_name,
    worker_pdb,
)
from control.keda import KafkaAccess, msk_trigger_authentication, scaled_object, version_scaling
from schemas.registry import DeploymentVersion
from topics.kafka_connection import KafkaConnection

CONFIG_MAP = "llmq-config"
REDIS_SECRET = "llmq-redis"
GATEWAY_PORT = 8000
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
SKIPS = {
    "CKV_K8S_43": "the image is a parameter (--image); pin it by digest in production",
    "CKV_K8S_35": "llmq reads settings from LLMQ_* variables; the Redis URL is its one secret",
    "CKV_K8S_11": "no CPU limit on purpose: a throttled process stalls every stream it serves",
}
"""checkov findings accepted for every llmq pod, with why (annotations on each workload)."""
BATCH_PROBE_PORT = 8081


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
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    gateway_replicas: PositiveInt = 3
    gateway_max_replicas: PositiveInt = 12
    weight_cache_path: str = "/mnt/k8s-disks/0/llmq/weights"
    """The node's NVMe RAID0 (nodeadm `localStorage`) where workers cache weights."""
    drain_grace_s: float = 120.0
    pools: list[FleetPool]


def _meta(name: str, fleet: Fleet, **extra: Any) -> Manifest:
    return {"name": name, "namespace": fleet.namespace, **extra}


def _skips() -> dict[str, str]:
    """checkov's skip annotations (`checkov.io/skipN: ID=reason`)."""
    return {f"checkov.io/skip{i}": f"{k}={v}" for i, (k, v) in enumerate(SKIPS.items(), 1)}


def _pod_spec(account: str, container: Manifest, **extra: Any) -> Manifest:
    """A pod of llmq's own: unprivileged, read-only root, a /tmp volume, no API token."""
    container = {
        **container,
        "imagePullPolicy": "Always",
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    container["env"] = [*container["env"], {"name": "HOME", "value": "/tmp"}]
    return {
        "serviceAccountName": account,
        "automountServiceAccountToken": False,  # IRSA mounts its own token
        "securityContext": dict(POD_SECURITY),
        "nodeSelector": {"llmq.dev/role": "gateway"},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        **extra,
    }


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
        },
    }


def _env_from() -> list[Manifest]:
    return [{"configMapRef": {"name": CONFIG_MAP}}]


def _redis_env() -> Manifest:
    return {
        "name": "LLMQ_REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": "url"}},
    }


def _labels(app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "llmq"}


def _http_probe(path: str, period_s: int, failures: int, port: int = GATEWAY_PORT) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def _gateway(fleet: Fleet) -> list[Manifest]:
    labels = _labels("llmq-gateway")
    container = {
        "name": "gateway",
        "image": fleet.image,
        "command": ["llmq", "gateway"],
        "envFrom": _env_from(),
        "env": [
            {"name": "LLMQ_HOST", "value": "0.0.0.0"},
            {"name": "LLMQ_PORT", "value": str(GATEWAY_PORT)},
            {"name": "LLMQ_ROUTING", "value": "affinity"},
            _redis_env(),
        ],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/readyz", 5, 2),
        "livenessProbe": _http_probe("/healthz", 10, 3),
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("llmq-gateway", fleet, labels=labels, annotations=_skips()),
        "spec": {
            "replicas": fleet.gateway_replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # Streams in flight finish before the gateway exits.
                "spec": _pod_spec("llmq-gateway", container, terminationGracePeriodSeconds=60),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("llmq-gateway", fleet, labels=labels),
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta("llmq-gateway", fleet, labels=labels),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta("llmq-gateway", fleet, labels=labels),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": "llmq-gateway"},
            "minReplicas": fleet.gateway_replicas,
            "maxReplicas": max(fleet.gateway_max_replicas, fleet.gateway_replicas),
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": 60}}}],
        },
    }  # fmt: skip
    return [deployment, service, pdb, hpa]


def _batch_service(fleet: Fleet) -> Manifest:
    labels = _labels("llmq-batch")
    container = {
        "name": "batch",
        "image": fleet.image,
        "command": ["llmq", "batch", "serve"],
        "envFrom": _env_from(),
        "env": [
            {"name": "LLMQ_PROBE_PORT", "value": str(BATCH_PROBE_PORT)},
            {"name": "LLMQ_PROBE_HOST", "value": "0.0.0.0"},
            _redis_env(),
        ],
        "ports": [{"name": "probes", "containerPort": BATCH_PROBE_PORT, "protocol": "TCP"}],
        "readinessProbe": _http_probe("/readyz", 10, 3, BATCH_PROBE_PORT),
        "livenessProbe": _http_probe("/healthz", 10, 3, BATCH_PROBE_PORT),
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("llmq-batch", fleet, labels=labels, annotations=_skips()),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec("llmq-batch", container),
            },
        },
    }


def _network_policies(fleet: Fleet) -> list[Manifest]:
    """Nothing reaches llmq's pods but the gateway's port (workers and the batch service
    only call out: to MSK, Redis, S3); kubelet probes are not subject to policies."""
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
            "podSelector": {"matchLabels": _labels("llmq-gateway")},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": GATEWAY_PORT, "protocol": "TCP"}]}],
        },
    }
    return [deny, gateway]


def pool_version(pool: FleetPool) -> DeploymentVersion:
    """A pool's deployment version as the registry would hold it."""
    return DeploymentVersion.model_validate(
        {
            "version": pool.version, "path": pool.path, "weights_uri": pool.weights_uri,
            "tensor_parallel_size": pool.tensor_parallel, "max_model_len": pool.max_model_len,
            "pool": pool.pool, "ttft_slo_s": pool.ttft_slo_s, "tpot_slo_s": pool.tpot_slo_s,
            "replicas": {"min": pool.min_replicas, "max": pool.max_replicas}, "created_at": 0,
        }
    )  # fmt: skip


def _workers(fleet: Fleet, pool: FleetPool, kafka: KafkaAccess) -> list[Manifest]:
    settings = KubernetesSettings(
        namespace=fleet.namespace, image=fleet.image, service_account="llmq-worker",
        image_pull_policy="Always", weight_cache="hostPath", host_path=fleet.weight_cache_path,
        drain_grace_s=fleet.drain_grace_s, cpu=str(8 * pool.tensor_parallel),
        memory=f"{64 * pool.tensor_parallel}Gi",
    )  # fmt: skip
    version = pool_version(pool)
    deployment = worker_deployment(
        pool.deployment, version, settings, {},
        replicas=pool.min_replicas,
    )  # fmt: skip
    deployment["metadata"]["annotations"].update(_skips())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["envFrom"] = _env_from()
    container["env"].append(_redis_env())
    scaling = version_scaling(pool.deployment, version)
    name = worker_name(pool.deployment, pool.version)
    return [
        deployment,
        worker_pdb(pool.deployment, version, settings),
        scaled_object(name, fleet.namespace, scaling, kafka, fleet.prometheus_url),
    ]


def render_fleet(fleet: Fleet) -> list[Manifest]:
    """Every object, in the order `kubectl apply` should create them."""
    kafka = KafkaAccess(bootstrap_servers=fleet.kafka_bootstrap, aws_region=fleet.aws_region)
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
    ]
    for pool in fleet.pools:
        objects += _workers(fleet, pool, kafka)
    return objects
