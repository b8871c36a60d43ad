"""llmq's Kubernetes manifests of worker replicas: a `Deployment` and a `PodDisruptionBudget`
per deployment version, rendered as plain dicts (what the API takes as a request body), and
the worker environment a version implies (shared with the local adapter).

Pure code: nothing here talks to a cluster or imports the Kubernetes client.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

import structlog
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.registry import DeploymentVersion

log = structlog.get_logger()

Manifest = dict[str, Any]
"""A Kubernetes object as the API's JSON takes it."""

SETTINGS_FROM_SPEC = (
    "max_num_seqs",
    "kv_cache_gib",
    "tpot_slo_s",
    "batch_max_in_flight",
    "sim_model",
    "sim_time_scale",
    "max_lora_rank",
    "max_loras",
    "max_cpu_loras",
)
"""`engine_args` a version may set for its workers (their `LLMQ_*` settings; the `sim_*`
ones only matter to simulated workers)."""

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
DEPLOYMENT_KEY = "llmq.dev/deployment"
"""Label (a label-safe form of the name) and annotation (the exact name) of the deployment."""
VERSION_KEY = "llmq.dev/version"
"""Label (label-safe) and annotation (exact) of the version."""
POOL_LABEL = "llmq.dev/pool"
"""The pool, on worker objects and on the nodes that may run that pool's workers."""
WORKER_APP = "llmq-worker"
MANAGER = "llmq-controller"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"
"""The label selector of the objects the pool controller manages."""
GPU_RESOURCE = "nvidia.com/gpu"
WEIGHTS_MOUNT = "/var/cache/llmq/weights"
"""Where a worker container sees its weight cache (`LLMQ_WEIGHTS_CACHE_DIR`)."""
RUN_AS = 10001
"""The unprivileged user (and group) llmq's containers run as; the root filesystem is
read-only, so everything a process writes goes to a volume (`/tmp`, the weight cache)."""
POD_SECURITY: Manifest = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: Manifest = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
WORKER_COMMAND = ["llmq", "worker"]
GRACE_MARGIN_S = 30
"""Seconds a pod's termination grace exceeds the workers' drain grace (engine shutdown)."""

_NAME_PREFIX = "llmq-worker-"
_DNS_LABEL_MAX = 63
_HASH_CHARS = 8
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class KubernetesSettings(BaseSettings):
    """The Kubernetes adapter of the pool controller (`LLMQ_K8S_*`); built once at start-up."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_K8S_", extra="ignore")

    namespace: str = "llmq"
    """The namespace of the worker Deployments (the controller's service account needs the
    Role of `control/k8s_rbac.py` there: Deployments, their scale, PodDisruptionBudgets and
    a read of pods)."""
    image: str = "llmq:latest"
    """The worker container image (it runs `llmq worker`)."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls `image`."""
    service_account: str | None = None
    """The workers' service account; None: the namespace's default. Workers never call the
    Kubernetes API, so their pods mount no token."""
    gpu: bool = True
    """Workers take `tensor_parallel_size` GPUs (`nvidia.com/gpu`) and tolerate the GPU
    nodes' taint; False: CPU workers, no GPU resources."""
    weight_cache: Literal["emptyDir", "hostPath"] = "emptyDir"
    """The weight cache volume: `emptyDir` (one per pod, gone with it) or `hostPath` (the
    node's disk at `host_path`, e.g. NVMe, shared by the node's workers across restarts)."""
    host_path: str = "/mnt/nvme/llmq/weights"
    """The node folder of the weight cache with `weight_cache=hostPath`."""
    probe_port: int = Field(default=8081, ge=1, le=65535)
    """The workers' probe port (`/healthz`, `/readyz`), their `LLMQ_PROBE_PORT`."""
    drain_grace_s: float = Field(default=60.0, gt=0)
    """The workers' `LLMQ_DRAIN_GRACE_S`; their pods get this plus 30 s to terminate."""
    startup_timeout_s: int = Field(default=1800, ge=10)
    """How long a worker may take to become ready (weight download and load) before the
    kubelet restarts it."""
    in_cluster: bool = True
    """Reach the API with the pod's service account; False: with the local kubeconfig."""
    cpu_per_gpu: int | None = Field(default=None, ge=1)
    """CPUs a worker requests per GPU of its version; None: none requested. No CPU limit is
    set: a throttled worker stalls its engine's steps."""
    memory_gib_per_gpu: int | None = Field(default=None, ge=1)
    """Memory (GiB) a worker requests and is limited to per GPU; None: neither."""
    config_map: str | None = None
    """A ConfigMap every worker takes its environment from (`envFrom`: the broker, the
    connection, the buckets), before what its version sets."""
    redis_secret: str | None = None
    """A Secret whose `url` key is the workers' `LLMQ_REDIS_URL` (it holds the auth token)."""
    autoscaler: Literal["none", "keda"] = "none"
    """`keda`: each worker Deployment gets a KEDA `ScaledObject` (created with it, deleted
    when its version drains) that scales it between the version's `replicas.min` and
    `replicas.max` on job-topic lag, KV use and TTFT; the controller then only keeps each
    active version within those bounds. `none`: the controller holds each at `replicas.min`."""
    keda_kafka_bootstrap: str = ""
    """MSK's IAM bootstrap brokers, where the `ScaledObject`s read consumer lag."""
    keda_aws_region: str = ""
    """The MSK cluster's region."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """The Prometheus that scrapes the gateways (KV use and TTFT triggers)."""


def version_env(
    name: str, version: DeploymentVersion, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The `LLMQ_*` environment of a worker of `version` of deployment `name`: `base` (what
    every worker gets) with the version's model, path, pool, context, precision, weights and
    the `engine_args` that are worker settings. Every adapter adds its replica id."""
    env = dict(base or {})
    env.update(
        {
            "LLMQ_MODEL": name,
            "LLMQ_MODEL_PATH": version.path,
            "LLMQ_POOL": version.pool,
            "LLMQ_MAX_MODEL_LEN": str(version.max_model_len),
            "LLMQ_DTYPE": version.precision,
        }
    )
    if version.weights_uri is not None:
        env["LLMQ_WEIGHTS_URI"] = version.weights_uri
    if version.sha256 is not None:
        env["LLMQ_WEIGHTS_SHA256"] = version.sha256
    if version.tpot_slo_s is not None:
        env["LLMQ_TPOT_SLO_S"] = str(version.tpot_slo_s)
    for key, value in version.engine_args.items():
        if key in SETTINGS_FROM_SPEC:
            env[f"LLMQ_{key.upper()}"] = str(value)
        else:
            log.warning("engine_arg_not_applied", deployment=name, arg=key)
    return env


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:_HASH_CHARS]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def worker_name(name: str, version: str) -> str:
    """The Deployment (and PDB) name of a version: `llmq-worker-<name>-<version>-<hash>`, a
    DNS-1123 label of at most 63 characters. Slugging is lossy (case, `/`, `.`, `_`, where
    name ends and version starts) and long names are cut, so a hash of the exact pair always
    ends it: two versions never share a name."""
    suffix = f"-{_short_hash(name, version)}"
    room = _DNS_LABEL_MAX - len(_NAME_PREFIX) - len(suffix)
    body = "-".join(part for part in (_slug(name), _slug(version)) if part)
    body = body[:room].rstrip("-")
    return f"{_NAME_PREFIX}{body}{suffix}" if body else f"{_NAME_PREFIX.rstrip('-')}{suffix}"


def label_value(text: str) -> str:
    """`text` as a label value (63 characters of `[A-Za-z0-9._-]`, alphanumeric at both
    ends): `/` becomes `_`, anything else invalid `.`; one cut short gets a hash."""
    if len(text) <= _DNS_LABEL_MAX and _LABEL_VALUE.match(text):
        return text
    safe = re.sub(r"[^A-Za-z0-9._-]", ".", text.replace("/", "_"))
    if len(safe) <= _DNS_LABEL_MAX and _LABEL_VALUE.match(safe):
        return safe
    suffix = _short_hash(text)
    return f"{safe[: _DNS_LABEL_MAX - len(suffix) - 1].strip('._-')}-{suffix}".lstrip("-")


def worker_labels(name: str, version: DeploymentVersion) -> dict[str, str]:
    """The labels of a version's worker objects and pods (its pool's included)."""
    return {
        NAME_LABEL: WORKER_APP,
        INSTANCE_LABEL: worker_name(name, version.version),
        MANAGED_BY_LABEL: MANAGER,
        DEPLOYMENT_KEY: label_value(name),
        VERSION_KEY: label_value(version.version),
        POOL_LABEL: label_value(version.pool),
    }


def _selector(name: str, version: DeploymentVersion) -> dict[str, Any]:
    return {
        "matchLabels": {
            NAME_LABEL: WORKER_APP,
            INSTANCE_LABEL: worker_name(name, version.version),
        }
    }


def scrape_annotations(port: int) -> dict[str, str]:
    """What tells Prometheus's Kubernetes pod discovery (the common `prometheus.io/*`
    relabelling) to scrape a pod's `/metrics` on `port`."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics"}  # fmt: skip


def _metadata(name: str, version: DeploymentVersion, settings: KubernetesSettings) -> Manifest:
    return {
        "name": worker_name(name, version.version),
        "namespace": settings.namespace,
        "labels": worker_labels(name, version),
        "annotations": {DEPLOYMENT_KEY: name, VERSION_KEY: version.version},
    }


def pod_env(
    name: str,
    version: DeploymentVersion,
    settings: KubernetesSettings,
    base: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """The worker container's `env`: `version_env`, then what a pod sets (probes on every
    address, JSON logs, the drain grace, the weight cache mount), then its replica id: the
    pod's name (downward API)."""
    env = version_env(name, version, base)
    env.update(
        {
            "LLMQ_PROBE_PORT": str(settings.probe_port),
            "LLMQ_PROBE_HOST": "0.0.0.0",
            "LLMQ_LOG_JSON": "true",
            "LLMQ_DRAIN_GRACE_S": str(settings.drain_grace_s),
            "LLMQ_WEIGHTS_CACHE_DIR": WEIGHTS_MOUNT,
            "HOME": "/tmp",  # caches (vLLM's, torch's) on the /tmp volume
        }
    )
    env.pop("LLMQ_REPLICA_ID", None)
    pod_name = {"fieldRef": {"fieldPath": "metadata.name"}}
    return [{"name": key, "value": value} for key, value in sorted(env.items())] + [
        {"name": "LLMQ_REPLICA_ID", "valueFrom": pod_name}
    ]


def _probe(path: str, settings: KubernetesSettings, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": settings.probe_port},
        "periodSeconds": period_s,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _volumes(version: DeploymentVersion, settings: KubernetesSettings) -> list[Manifest]:
    cache: Manifest = (
        {"hostPath": {"path": settings.host_path, "type": "DirectoryOrCreate"}}
        if settings.weight_cache == "hostPath"
        else {"emptyDir": {}}
    )
    volumes = [{"name": "weights", **cache}, {"name": "tmp", "emptyDir": {}}]
    if settings.gpu and version.tensor_parallel_size > 1:  # NCCL's shared memory
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    return volumes


def _container(
    name: str,
    version: DeploymentVersion,
    settings: KubernetesSettings,
    base: Mapping[str, str] | None,
) -> Manifest:
    mounts = [
        {"name": "weights", "mountPath": WEIGHTS_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if settings.gpu and version.tensor_parallel_size > 1:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container: Manifest = {
        "name": "worker",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(WORKER_COMMAND),
        "env": pod_env(name, version, settings, base),
        "ports": [{"name": "probes", "containerPort": settings.probe_port, "protocol": "TCP"}],
        "startupProbe": _probe("/readyz", settings, 10, max(1, settings.startup_timeout_s // 10)),
        "readinessProbe": _probe("/readyz", settings, 5, 2),
        "livenessProbe": _probe("/healthz", settings, 10, 3),
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
    }
    if settings.config_map is not None:
        container["envFrom"] = [{"configMapRef": {"name": settings.config_map}}]
    if settings.redis_secret is not None:
        secret = {"secretKeyRef": {"name": settings.redis_secret, "key": "url"}}
        container["env"].append({"name": "LLMQ_REDIS_URL", "valueFrom": secret})
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if settings.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(version.tensor_parallel_size)
    gpus = version.tensor_parallel_size
    if settings.cpu_per_gpu is not None:
        requests["cpu"] = str(settings.cpu_per_gpu * gpus)
    if settings.memory_gib_per_gpu is not None:
        requests["memory"] = limits["memory"] = f"{settings.memory_gib_per_gpu * gpus}Gi"
    if requests:
        container["resources"] = {"requests": requests, "limits": limits}
    return container


def termination_grace_s(settings: KubernetesSettings) -> int:
    """A worker pod's `terminationGracePeriodSeconds`: its drain grace plus a margin."""
    return math.ceil(settings.drain_grace_s) + GRACE_MARGIN_S


def worker_deployment(
    name: str,
    version: DeploymentVersion,
    settings: KubernetesSettings,
    base_env: Mapping[str, str] | None = None,
    replicas: int = 1,
) -> Manifest:
    """The `Deployment` of the workers of `version` of deployment `name`.

    Deleting a pod (scale-down, the Deployment's deletion) sends its worker SIGTERM, which
    drains it: it takes no new job, finishes its streams within `drain_grace_s`, commits and
    exits. So no preStop hook is needed (workers sit behind no Service whose endpoints would
    have to be left first); the termination grace only has to outlast the drain."""
    spec: Manifest = {
        "terminationGracePeriodSeconds": termination_grace_s(settings),
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY),
        "nodeSelector": {POOL_LABEL: label_value(version.pool)},
        "containers": [_container(name, version, settings, base_env)],
        "volumes": _volumes(version, settings),
    }
    if settings.service_account is not None:
        spec["serviceAccountName"] = settings.service_account
    if settings.gpu:
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, version, settings),
        "spec": {
            "replicas": replicas,
            "selector": _selector(name, version),
            "template": {
                "metadata": {
                    "labels": worker_labels(name, version),
                    "annotations": scrape_annotations(settings.probe_port),
                },
                "spec": spec,
            },
        },
    }


def worker_pdb(name: str, version: DeploymentVersion, settings: KubernetesSettings) -> Manifest:
    """The `PodDisruptionBudget` of a version's workers: voluntary disruptions (node drains)
    take at most one of them at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(name, version, settings),
        "spec": {"maxUnavailable": 1, "selector": _selector(name, version)},
    }
