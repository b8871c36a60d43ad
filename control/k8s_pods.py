"""The pods of llmq's own processes on Kubernetes (gateway, batch service, controller): one
shape for all, so each differs only in what it runs. Every one is unprivileged with a
read-only root (writing to `/tmp` and shared emptyDirs), reads the fleet's ConfigMap and
the Redis URL Secret, and mounts a Kubernetes API token only if it calls the API.

Pure code: renders dicts (`control.k8s_fleet` assembles the fleet from them).
"""

from __future__ import annotations

from typing import Any

from control.k8s_manifests import CONTAINER_SECURITY, POD_SECURITY, Manifest, scrape_annotations

CONFIG_MAP = "llmq-config"
REDIS_SECRET = "llmq-redis"
SKIPS = {
    "CKV_K8S_43": "the image is a parameter (--image); pin it by digest in production",
    "CKV_K8S_35": "llmq reads settings from LLMQ_* variables; the Redis URL is its one secret",
    "CKV_K8S_11": "no CPU limit on purpose: a throttled process stalls every stream it serves",
}
"""checkov findings accepted for every llmq pod, with why (annotations on each workload)."""


def labels(app: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "llmq"}


def skips(extra: dict[str, str] | None = None) -> dict[str, str]:
    """checkov's skip annotations (`checkov.io/skipN: ID=reason`)."""
    reasons = {**SKIPS, **(extra or {})}
    return {f"checkov.io/skip{i}": f"{k}={v}" for i, (k, v) in enumerate(reasons.items(), 1)}


def env_from() -> list[Manifest]:
    return [{"configMapRef": {"name": CONFIG_MAP}}]


def redis_env() -> Manifest:
    return {
        "name": "LLMQ_REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": REDIS_SECRET, "key": "url"}},
    }


def http_probe(path: str, port: int, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def process(
    name: str,
    image: str,
    command: list[str],
    env: dict[str, str],
    *,
    port: tuple[str, int],
    cpu: str,
    memory: str,
) -> Manifest:
    """The container of one llmq process: its `env` after the ConfigMap's, the Redis URL,
    `/readyz` and `/healthz` on its port (`(name, number)`), requests and a memory limit of
    twice the request."""
    port_name, number = port
    limit = f"{2 * int(memory.removesuffix('Gi'))}Gi"
    return {
        "name": name,
        "image": image,
        "command": command,
        "envFrom": env_from(),
        "env": [{"name": k, "value": v} for k, v in env.items()] + [redis_env()],
        "ports": [{"name": port_name, "containerPort": number, "protocol": "TCP"}],
        "readinessProbe": http_probe("/readyz", number, 5, 3),
        "livenessProbe": http_probe("/healthz", number, 10, 3),
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": limit}},
    }


def _secure(container: Manifest, mounts: list[Manifest]) -> Manifest:
    """Unprivileged, read-only root, writing only to volumes."""
    return {
        **container,
        "imagePullPolicy": "Always",
        "securityContext": dict(CONTAINER_SECURITY),
        "env": [*container.get("env", []), {"name": "HOME", "value": "/tmp"}],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mounts],
    }


def pod_spec(
    account: str,
    container: Manifest,
    *,
    role: str = "gateway",
    api_token: bool = False,
    init: list[Manifest] = [],  # noqa: B006 (never mutated)
    volumes: dict[str, str] = {},  # noqa: B006 (never mutated)
    **extra: Any,
) -> Manifest:
    """A pod on the `role` node group: `volumes` (name -> mount path) are emptyDirs its
    containers share. Only a process that calls the Kubernetes API mounts a token (IRSA
    mounts its own)."""
    mounts = [{"name": name, "mountPath": path} for name, path in volumes.items()]
    spec: Manifest = {
        "serviceAccountName": account,
        "automountServiceAccountToken": api_token,
        "securityContext": dict(POD_SECURITY),
        "nodeSelector": {"llmq.dev/role": role},
        "containers": [_secure(container, mounts)],
        "volumes": [{"name": "tmp", "emptyDir": {}}]
        + [{"name": name, "emptyDir": {}} for name in volumes],
        **extra,
    }
    if init:
        spec["initContainers"] = [_secure(c, mounts) for c in init]
    return spec


def workload(
    name: str,
    namespace: str,
    pod: Manifest,
    *,
    replicas: int = 1,
    accepted: dict[str, str] | None = None,
    metrics_port: int | None = None,
    **spec: Any,
) -> Manifest:
    """The `Deployment` of one process (`accepted`: its own checkov skips and reasons;
    `metrics_port`: where Prometheus scrapes its `/metrics`)."""
    selected = labels(name)
    template: Manifest = {"labels": selected}
    if metrics_port is not None:
        template["annotations"] = scrape_annotations(metrics_port)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": selected,
                     "annotations": skips(accepted)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selected},
            "template": {"metadata": template, "spec": pod},
            **spec,
        },
    }  # fmt: skip
