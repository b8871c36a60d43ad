"""The Kubernetes adapter of the pool controller against fakes of `AppsV1Api` and
`PolicyV1Api` that keep the objects written through them, answer with the client's own models
(deserialized from API responses recorded under `fixtures/k8s/`) and record every call."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from kubernetes.client import ApiClient, AppsV1Api, CoreV1Api, CustomObjectsApi, PolicyV1Api
from kubernetes.client.exceptions import ApiException

from control.k8s_manifests import (
    MANAGED_SELECTOR,
    KubernetesSettings,
    worker_deployment,
    worker_name,
    worker_pdb,
)
from control.kubernetes_replicas import (
    AppsApi,
    CoreApi,
    KubernetesReplicas,
    PolicyApi,
    managed_key,
    pod_failure,
)
from control.kubernetes_replicas import (
    CustomObjectsApi as CustomApi,
)
from control.pool_controller import WEIGHTS_FAILURE, PoolController
from control.registry import DeploymentRegistry, first_record
from schemas.deployment import ReplicaBounds
from schemas.registry import DeploymentVersion
from tests.unit.test_pool_controller import Backlog
from tests.unit.test_registry import MemoryRegistryLog

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
SETTINGS = KubernetesSettings(namespace="llmq", image="registry.example.com/llmq:0.1.0")
BASE_ENV = {
    "LLMQ_KAFKA_BOOTSTRAP": "kafka.llmq.svc:9092",
    "LLMQ_REDIS_URL": "redis://redis.llmq.svc:6379/0",
}
SMOL = DeploymentVersion(version="1", path="/models/smollm2", pool="l4", created_at=1)
LLAMA_NAME = "meta-llama/Llama-3.1-70B-Instruct"
LLAMA = DeploymentVersion(
    version="2", path="/models/llama-3.1-70b", pool="h200-tp4", created_at=1,
    tensor_parallel_size=4, max_model_len=8192,
)  # fmt: skip


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def as_model(data: Any, klass: str) -> Any:
    """`data` (the API's JSON) as the client's model `klass`, deserialized the way the client
    deserializes a response body."""
    api = ApiClient()
    text = json.dumps(data)
    try:
        return api.deserialize(text, klass, "application/json")
    except TypeError:  # the clients before the pydantic models took the response object
        legacy: Any = api
        return legacy.deserialize(SimpleNamespace(data=text), klass)


def api_error(status: int) -> ApiException:
    status_body = recorded(f"status_{status}.json") if status in (404, 409) else {"code": status}
    error = ApiException(status=status, reason=status_body.get("reason", "Forbidden"))
    error.body = json.dumps(status_body)
    return error


class FakeStore:
    """Objects of one kind, as the server stores them, and the calls made."""

    def __init__(self, stored: list[dict[str, Any]] | None = None) -> None:
        self.stored = {d["metadata"]["name"]: copy.deepcopy(d) for d in stored or []}
        self.calls: list[tuple[Any, ...]] = []

    def _create(self, namespace: str, body: Any, fixture: str, klass: str) -> Any:
        """Store `body` with what the server adds to one (from its recorded response)."""
        self.calls.append(("create", namespace, body))
        name = body["metadata"]["name"]
        if name in self.stored:
            raise api_error(409)
        created = recorded(fixture)
        created["metadata"] = {**created["metadata"], **body["metadata"]}
        created["spec"] = copy.deepcopy(body["spec"])
        self.stored[name] = created
        return as_model(created, klass)

    def _delete(self, name: str) -> Any:
        self.calls.append(("delete", name))
        if self.stored.pop(name, None) is None:
            raise api_error(404)
        return as_model(recorded("status_deleted.json"), "V1Status")


class FakeApps(FakeStore):
    """`AppsV1Api`. Its list answers every stored object whatever the selector (like the
    recorded list response), so the adapter's own checks are what keeps others'
    Deployments out."""

    def __init__(self, stored: list[dict[str, Any]] | None = None) -> None:
        super().__init__(stored)
        self.forbidden: set[str] = set()

    def writes(self) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] != "list"]

    def list_namespaced_deployment(
        self, namespace: str, *, label_selector: str, _request_timeout: float
    ) -> Any:
        self.calls.append(("list", namespace, label_selector))
        listed = recorded("deployment_list.json")
        listed["items"] = list(self.stored.values())
        return as_model(listed, "V1DeploymentList")

    def create_namespaced_deployment(
        self, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any:
        if "create" in self.forbidden:
            self.calls.append(("create", namespace, body))
            raise api_error(403)
        return self._create(namespace, body, "deployment_created.json", "V1Deployment")

    def patch_namespaced_deployment_scale(
        self, name: str, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any:
        self.calls.append(("scale", name, body["spec"]["replicas"]))
        if name not in self.stored:
            raise api_error(404)
        self.stored[name]["spec"]["replicas"] = body["spec"]["replicas"]
        scale = recorded("scale.json")
        scale["metadata"]["name"], scale["spec"] = name, dict(body["spec"])
        return as_model(scale, "V1Scale")

    def delete_namespaced_deployment(
        self, name: str, namespace: str, *, _request_timeout: float
    ) -> Any:
        return self._delete(name)


class FakePolicy(FakeStore):
    """`PolicyV1Api`."""

    def create_namespaced_pod_disruption_budget(
        self, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any:
        return self._create(namespace, body, "pdb_created.json", "V1PodDisruptionBudget")

    def delete_namespaced_pod_disruption_budget(
        self, name: str, namespace: str, *, _request_timeout: float
    ) -> Any:
        return self._delete(name)


class FakeCore:
    """`CoreV1Api`: its pod list answers `pods` (the items of `pod_list.json`, a response
    written in the API's shape: there is no cluster here to record one from), whatever the
    selector."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[tuple[Any, ...]] = []

    def list_namespaced_pod(
        self, namespace: str, *, label_selector: str, _request_timeout: float
    ) -> Any:
        self.calls.append(("list", namespace, label_selector))
        listed = recorded("pod_list.json")
        listed["items"] = self.pods
        return as_model(listed, "V1PodList")


def recorded_pods() -> dict[str, dict[str, Any]]:
    """The pods of `pod_list.json` by the tail of their names."""
    return {pod["metadata"]["name"][-5:]: pod for pod in recorded("pod_list.json")["items"]}


class FakeCustom(FakeStore):
    """`CustomObjectsApi`, for KEDA's `ScaledObject`s."""

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Any, *,
        _request_timeout: float,
    ) -> Any:  # fmt: skip
        assert (group, version, plural) == ("keda.sh", "v1alpha1", "scaledobjects")
        self.calls.append(("create", namespace, body))
        if body["metadata"]["name"] in self.stored:
            raise api_error(409)
        self.stored[body["metadata"]["name"]] = copy.deepcopy(body)
        return copy.deepcopy(body)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, *,
        _request_timeout: float,
    ) -> Any:  # fmt: skip
        assert (group, version, plural) == ("keda.sh", "v1alpha1", "scaledobjects")
        return self._delete(name)


class Closable:
    closed = False

    def close(self) -> None:
        self.closed = True


def _runner(
    apps: FakeApps, policy: FakePolicy | None = None, prepared: list[str] | None = None
) -> KubernetesReplicas:
    async def prepare(version: DeploymentVersion) -> None:
        if prepared is not None:
            prepared.append(version.pool)

    return KubernetesReplicas(SETTINGS, apps, policy or FakePolicy(), BASE_ENV, prepare)


def _api_methods(api: type) -> set[str]:
    return {method for method in vars(api) if "_namespaced_" in method}


@pytest.mark.parametrize(
    ("protocol", "fake", "real"),
    [
        (AppsApi, FakeApps, AppsV1Api),
        (PolicyApi, FakePolicy, PolicyV1Api),
        (CoreApi, FakeCore, CoreV1Api),
        (CustomApi, FakeCustom, CustomObjectsApi),
    ],
)
def test_the_fakes_take_what_the_adapter_calls_and_the_client_has(
    protocol: type, fake: type, real: type
) -> None:
    assert _api_methods(fake) == _api_methods(protocol)
    for method in _api_methods(fake):
        takes = set(inspect.signature(getattr(fake, method)).parameters) - {"self"}
        assert takes <= set(inspect.signature(getattr(real, method)).parameters), method


async def test_start_twice_creates_the_deployment_once_then_scales_it_to_two() -> None:
    apps, policy, prepared = FakeApps(), FakePolicy(), list[str]()
    runner = _runner(apps, policy, prepared)
    await runner.load()
    assert runner.running() == {}
    await runner.start("smollm2", SMOL)
    await runner.start("smollm2", SMOL)
    name = worker_name("smollm2", "1")
    assert apps.writes() == [
        ("create", "llmq", worker_deployment("smollm2", SMOL, SETTINGS, BASE_ENV)),
        ("scale", name, 2),
    ]
    assert policy.calls == [("create", "llmq", worker_pdb("smollm2", SMOL, SETTINGS))]
    assert prepared == ["l4"]  # the pool's topics, before the first replica only
    assert runner.running() == {("smollm2", "1"): 2}
    assert apps.stored[name]["spec"]["replicas"] == 2
    assert ("list", "llmq", MANAGED_SELECTOR) in apps.calls


async def test_stop_one_scales_down_and_the_last_one_deletes_the_deployment_and_pdb() -> None:
    apps, policy = FakeApps(), FakePolicy()
    runner = _runner(apps, policy)
    await runner.start("smollm2", SMOL)
    await runner.start("smollm2", SMOL)
    name, key = worker_name("smollm2", "1"), ("smollm2", "1")
    await runner.stop_one(key)
    assert apps.writes()[-1] == ("scale", name, 1)
    assert runner.running() == {key: 1}
    await runner.stop_one(key)
    assert apps.writes()[-1] == ("delete", name)
    assert policy.calls[-1] == ("delete", name)
    assert runner.running() == {} and apps.stored == {} and policy.stored == {}
    writes = len(apps.writes())
    await runner.stop_one(key)  # nothing runs: nothing to do
    assert len(apps.writes()) == writes


async def test_load_rebuilds_running_from_a_recorded_list_and_ignores_the_rest() -> None:
    """The list holds a Helm-managed Deployment, a hand-made worker without the managed-by
    label, one being deleted and one scaled to 0 besides the two that run."""
    apps = FakeApps(recorded("deployment_list.json")["items"])
    runner = _runner(apps)
    await runner.load()
    assert apps.calls == [("list", "llmq", "app.kubernetes.io/managed-by=llmq-controller")]
    assert runner.running() == {(LLAMA_NAME, "2"): 3, ("smollm2", "1"): 1}
    await runner.stop_one(("smollm2", "0"))  # being deleted already: not ours to stop
    await runner.stop_one(("smollm2", "debug"))  # hand-made: not the controller's
    assert apps.writes() == []
    assert apps.stored["grafana"] == recorded("deployment_list.json")["items"][2]


def test_recorded_deployments_keep_their_names() -> None:
    """A new controller finds the Deployments an earlier one made: the names it derives
    for the recorded versions are the recorded names."""
    for item in recorded("deployment_list.json")["items"]:
        key = managed_key(as_model(item, "V1Deployment"))
        if key is not None:
            assert item["metadata"]["name"] == worker_name(*key)
    created = as_model(recorded("deployment_created.json"), "V1Deployment")
    assert managed_key(created) == ("smollm2", "1")


async def test_start_adopts_the_deployment_an_earlier_controller_made() -> None:
    apps, policy = FakeApps(recorded("deployment_list.json")["items"]), FakePolicy()
    runner = _runner(apps, policy)
    await runner.load()
    await runner.start(LLAMA_NAME, LLAMA)
    assert apps.writes() == [("scale", worker_name(LLAMA_NAME, "2"), 4)]
    assert policy.calls == []
    assert runner.running()[(LLAMA_NAME, "2")] == 4


async def test_a_deployment_created_since_the_last_load_is_scaled_instead() -> None:
    apps, policy = FakeApps(recorded("deployment_list.json")["items"]), FakePolicy()
    runner = _runner(apps, policy)  # never loaded: it believes nothing runs
    await runner.start("smollm2", SMOL)
    name = worker_name("smollm2", "1")
    assert [call[0] for call in apps.writes()] == ["create", "scale"]
    assert apps.writes()[-1] == ("scale", name, 2)
    assert runner.running()[("smollm2", "1")] == 2


async def test_a_missing_pdb_does_not_stop_the_deletion() -> None:
    apps, policy = FakeApps(recorded("deployment_list.json")["items"]), FakePolicy()
    runner = _runner(apps, policy)
    await runner.load()
    await runner.stop_one(("smollm2", "1"))  # its PDB is gone already: 404 is fine
    assert apps.writes() == [("delete", worker_name("smollm2", "1"))]
    assert ("smollm2", "1") not in runner.running()


async def test_other_api_errors_reach_the_controller() -> None:
    apps = FakeApps()
    apps.forbidden.add("create")
    runner = _runner(apps)
    with pytest.raises(ApiException) as raised:
        await runner.start("smollm2", SMOL)
    assert raised.value.status == 403
    assert runner.running() == {}


async def test_stop_all_leaves_the_replicas_running() -> None:
    apps, client = FakeApps(), Closable()
    runner = KubernetesReplicas(SETTINGS, apps, FakePolicy(), api_client=client)
    await runner.start("smollm2", SMOL)
    writes = apps.writes()
    await runner.stop_all()
    assert apps.writes() == writes and client.closed
    assert apps.stored[worker_name("smollm2", "1")]["spec"]["replicas"] == 1


async def test_the_pool_controller_drives_the_adapter() -> None:
    registry = DeploymentRegistry(MemoryRegistryLog())
    await registry.start()
    try:
        apps = FakeApps()
        runner = _runner(apps)
        controller = PoolController(registry, runner, Backlog())  # type: ignore[arg-type]
        version = SMOL.model_copy(update={"replicas": ReplicaBounds(min=2, max=2)})
        await registry.update("smollm2", lambda _: first_record("smollm2", version))
        await controller.reconcile()
        await controller.reconcile()  # the cache says 2 run: nothing more
        assert [call[0] for call in apps.writes()] == ["create", "scale"]
        assert runner.running() == {("smollm2", "1"): 2}
    finally:
        await registry.stop()


def test_pod_failure_reads_the_weights_exit_code_and_a_crash_loop_past_the_limit() -> None:
    pods = {tail: as_model(pod, "V1Pod") for tail, pod in recorded_pods().items()}
    assert pod_failure(pods["q8r2t"], crash_limit=5) == WEIGHTS_FAILURE  # exited 4, once
    assert pod_failure(pods["m4kfz"], crash_limit=5) == (
        "crash loop: its replicas exited 6 times in one pod (last exit code 1)"
    )
    assert pod_failure(pods["m4kfz"], crash_limit=7) is None  # not yet at the limit
    assert pod_failure(pods["x2x9q"], crash_limit=5) is None  # restarted 7 times, runs now
    assert pod_failure(pods["z7h5c"], crash_limit=5) is None  # still being created


async def test_failures_name_the_version_whose_pods_cannot_run() -> None:
    apps = FakeApps(recorded("deployment_list.json")["items"])
    pods = recorded_pods()
    core = FakeCore([pods["x2x9q"], pods["z7h5c"]])
    runner = KubernetesReplicas(SETTINGS, apps, FakePolicy(), BASE_ENV, core=core)
    await runner.load()
    assert await runner.failures() == {}
    core.pods.append(pods["q8r2t"])
    assert await runner.failures() == {}  # read again only every FAILURES_READ_S
    await runner.start("smollm2", SMOL)  # a write reloads
    assert await runner.failures() == {(LLAMA_NAME, "2"): WEIGHTS_FAILURE}
    assert core.calls[-1] == ("list", "llmq", MANAGED_SELECTOR)


async def test_with_keda_each_version_gets_a_scaled_object_until_it_drains() -> None:
    from tests.unit.test_k8s_fleet import keda_schema

    settings = SETTINGS.model_copy(
        update={"autoscaler": "keda", "keda_kafka_bootstrap": "b-1.msk:9098",
                "keda_aws_region": "eu-west-1"}
    )  # fmt: skip
    apps, custom = FakeApps(), FakeCustom()
    runner = KubernetesReplicas(settings, apps, FakePolicy(), BASE_ENV, custom=custom)
    assert runner.autoscaled
    bounded = LLAMA.model_copy(update={"replicas": ReplicaBounds(min=2, max=9)})
    await runner.start(LLAMA_NAME, bounded)
    name = worker_name(LLAMA_NAME, "2")
    scaled = custom.stored[name]
    jsonschema.validate(scaled, keda_schema("ScaledObject"))
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"name": name}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 9)
    assert spec["triggers"][0]["metadata"]["bootstrapServers"] == "b-1.msk:9098"
    await runner.start(LLAMA_NAME, bounded)  # one more replica: still one ScaledObject
    assert len(custom.stored) == 1
    await runner.stop_one((LLAMA_NAME, "2"))  # draining: KEDA lets go first
    assert custom.stored == {} and apps.writes()[-1] == ("scale", name, 1)
    with pytest.raises(ValueError, match="custom objects"):
        KubernetesReplicas(settings, apps, FakePolicy(), BASE_ENV)
