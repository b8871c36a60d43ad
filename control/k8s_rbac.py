"""What the pool controller may do in its namespace: its ServiceAccount, a Role with exactly
the calls its Kubernetes adapter (`control/kubernetes_replicas.py`) makes, and the
RoleBinding between them. Workers call no Kubernetes API and get no role."""

from __future__ import annotations

from control.k8s_manifests import (
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    KubernetesSettings,
    Manifest,
)

CONTROLLER_APP = "llmq-controller"
CONTROLLER_ACCOUNT = "llmq-controller"
"""The controller's ServiceAccount, Role and RoleBinding name."""

CONTROLLER_RULES: tuple[Manifest, ...] = (
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "create", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
)
"""One rule per resource the adapter touches, with the verbs it uses: Deployments (one per
version: listed to adopt them, created, deleted at zero), their scale (one replica more or
fewer), PodDisruptionBudgets, and pods (read for versions that cannot run)."""
KEDA_RULE: Manifest = {
    "apiGroups": ["keda.sh"],
    "resources": ["scaledobjects"],
    "verbs": ["create", "delete"],
}
"""With `autoscaler=keda`: each version's ScaledObject, created with it, deleted at drain."""


def _metadata(settings: KubernetesSettings) -> Manifest:
    return {
        "name": CONTROLLER_ACCOUNT,
        "namespace": settings.namespace,
        "labels": {NAME_LABEL: CONTROLLER_APP, MANAGED_BY_LABEL: MANAGER},
    }


def controller_rbac(settings: KubernetesSettings) -> list[Manifest]:
    """The controller's ServiceAccount, Role and RoleBinding in `settings.namespace` (run
    the controller's pod as `serviceAccountName: llmq-controller`)."""
    meta = _metadata(settings)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [dict(rule) for rule in CONTROLLER_RULES]
            + ([dict(KEDA_RULE)] if settings.autoscaler == "keda" else []),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": CONTROLLER_ACCOUNT,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": CONTROLLER_ACCOUNT,
                    "namespace": settings.namespace,
                }
            ],
        },
    ]
