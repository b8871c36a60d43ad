"""The controller's RBAC: valid objects, and a Role that allows every call the Kubernetes
adapter makes (read from its API protocols) and nothing else."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from control.k8s_manifests import KubernetesSettings
from control.k8s_rbac import CONTROLLER_ACCOUNT, controller_rbac
from control.kubernetes_replicas import AppsApi, CoreApi, CustomObjectsApi, PolicyApi

KUBE_VERSION = "1.31"
GROUPS = {AppsApi: "apps", PolicyApi: "policy", CoreApi: ""}
RESOURCES = {
    "deployment": "deployments",
    "deployment_scale": "deployments/scale",
    "pod_disruption_budget": "poddisruptionbudgets",
    "pod": "pods",
}


def adapter_calls() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of each method the adapter's protocols name, the way the
    official client names them (`patch_namespaced_deployment_scale`: patch of
    `deployments/scale`)."""
    calls = set()
    for protocol, group in GROUPS.items():
        for method in vars(protocol):
            found = re.fullmatch(r"(list|create|patch|delete|get)_namespaced_(\w+)", method)
            if found is not None:
                verb, kind = found.groups()
                calls.add((group, RESOURCES[kind], verb))
    return calls


def allowed(role: dict) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_role_allows_exactly_what_the_adapter_calls() -> None:
    (_, role, _) = controller_rbac(KubernetesSettings())
    assert len(adapter_calls()) == 7
    assert allowed(role) == adapter_calls()
    (_, keda_role, _) = controller_rbac(KubernetesSettings(autoscaler="keda"))
    keda_calls = {
        ("keda.sh", "scaledobjects", re.sub(r"_namespaced_custom_object$", "", method))
        for method in vars(CustomObjectsApi)
        if method.endswith("_namespaced_custom_object")
    }
    assert allowed(keda_role) == adapter_calls() | keda_calls


@pytest.mark.parametrize("namespace", ["llmq", "inference-prod"])
def test_the_objects_validate_and_bind_the_account_to_the_role(namespace: str) -> None:
    objects = controller_rbac(KubernetesSettings(namespace=namespace))
    for manifest in objects:
        kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        assert manifest["metadata"]["namespace"] == namespace
    account, role, binding = objects
    assert [o["kind"] for o in objects] == ["ServiceAccount", "Role", "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == CONTROLLER_ACCOUNT
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
    ]
