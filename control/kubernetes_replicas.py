"""The pool controller's Kubernetes adapter: a `ReplicaRunner` that runs each deployment
version's workers as one Kubernetes `Deployment` (with its `PodDisruptionBudget`), scaled one
replica at a time.

The official client is synchronous; each call runs in a thread (`asyncio.to_thread`). What
runs is cached (`spec.replicas` per version) so that `running()` stays synchronous: `load()`
fills the cache from the API at start-up and after each write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from control.k8s_manifests import (
    DEPLOYMENT_KEY,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_SELECTOR,
    MANAGER,
    VERSION_KEY,
    KubernetesSettings,
    worker_deployment,
    worker_name,
    worker_pdb,
)
from control.keda import KafkaAccess, scaled_object, version_scaling
from control.pool_controller import WEIGHTS_FAILURE, VersionKey, crash_loop
from schemas.registry import DeploymentVersion
from workers.exit_codes import WEIGHTS_EXIT_CODE

log = structlog.get_logger()

REQUEST_TIMEOUT_S = 30.0
"""How long one API call may take."""
FAILURES_READ_S = 15.0
"""How often `failures()` reads the pods again when nothing was written."""


def scaled_objects_path(namespace: str) -> tuple[str, str, str, str]:
    """Group, version, namespace and plural of KEDA's `ScaledObject`s in `namespace`."""
    return ("keda.sh", "v1alpha1", namespace, "scaledobjects")


Prepare = Callable[[DeploymentVersion], Awaitable[None]]
"""What must exist before a version's first replica starts (its pool's job topics)."""


class AppsApi(Protocol):
    """What the adapter calls of `kubernetes.client.AppsV1Api`."""

    def list_namespaced_deployment(
        self, namespace: str, *, label_selector: str, _request_timeout: float
    ) -> Any: ...

    def create_namespaced_deployment(
        self, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any: ...

    def patch_namespaced_deployment_scale(
        self, name: str, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any: ...

    def delete_namespaced_deployment(
        self, name: str, namespace: str, *, _request_timeout: float
    ) -> Any: ...


class CustomObjectsApi(Protocol):
    """What the adapter calls of `kubernetes.client.CustomObjectsApi` (KEDA's objects)."""

    def create_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        body: Any,
        *,
        _request_timeout: float,
    ) -> Any: ...

    def delete_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        *,
        _request_timeout: float,
    ) -> Any: ...


class CoreApi(Protocol):
    """What the adapter calls of `kubernetes.client.CoreV1Api`."""

    def list_namespaced_pod(
        self, namespace: str, *, label_selector: str, _request_timeout: float
    ) -> Any: ...


class PolicyApi(Protocol):
    """What the adapter calls of `kubernetes.client.PolicyV1Api`."""

    def create_namespaced_pod_disruption_budget(
        self, namespace: str, body: Any, *, _request_timeout: float
    ) -> Any: ...

    def delete_namespaced_pod_disruption_budget(
        self, name: str, namespace: str, *, _request_timeout: float
    ) -> Any: ...


def _status(exc: ApiException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def pod_failure(pod: Any, crash_limit: int) -> str | None:
    """Why a worker pod's version cannot run, from its containers' statuses: a container that
    exited with `WEIGHTS_EXIT_CODE`, or one in `CrashLoopBackOff` after `crash_limit`
    restarts; None for a pod that runs, starts or restarts within bounds."""
    status = pod.status
    for container in (status.container_statuses if status is not None else None) or []:
        state, last = container.state, container.last_state
        ended = [s.terminated for s in (state, last) if s is not None and s.terminated is not None]
        if any(t.exit_code == WEIGHTS_EXIT_CODE for t in ended):
            return WEIGHTS_FAILURE
        waiting = state.waiting if state is not None else None
        restarts = container.restart_count or 0
        if waiting is not None and waiting.reason == "CrashLoopBackOff" and restarts >= crash_limit:
            last_code = ended[0].exit_code if ended else None
            return crash_loop(restarts, "in one pod", last_code)
    return None


def managed_key(deployment: Any) -> VersionKey | None:
    """The (deployment, version) a Deployment object runs, when the pool controller manages
    it and it is not being deleted; None otherwise."""
    meta = deployment.metadata
    labels = (meta.labels if meta is not None else None) or {}
    annotations = (meta.annotations if meta is not None else None) or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGER or meta.deletion_timestamp is not None:
        return None
    name, version = annotations.get(DEPLOYMENT_KEY), annotations.get(VERSION_KEY)
    if not name or not version or meta.name != worker_name(name, version):
        return None
    return name, version


class KubernetesReplicas:
    """The `ReplicaRunner` of a Kubernetes cluster: a `Deployment` per version.

    `start` creates a version's Deployment (one replica) and its PDB, or scales an existing
    one up by one; `stop_one` scales it down by one, which makes Kubernetes delete a pod: its
    worker gets SIGTERM and drains (takes no new job, finishes its streams within its drain
    grace, commits, exits) inside the pod's termination grace. At zero the Deployment and
    PDB are deleted. Replicas that crash are restarted by Kubernetes, not by the controller;
    given the core API, `load()` also reads the versions' pods, and a version whose pods
    cannot run (`pod_failure`) is reported by `failures()`.
    """

    def __init__(
        self,
        settings: KubernetesSettings,
        apps: AppsApi,
        policy: PolicyApi,
        worker_env: Mapping[str, str] | None = None,
        prepare: Prepare | None = None,
        api_client: Any = None,
        core: CoreApi | None = None,
        crash_limit: int = 5,
        custom: CustomObjectsApi | None = None,
    ) -> None:
        self._settings = settings
        self._apps = apps
        self._policy = policy
        self._worker_env = dict(worker_env or {})
        self._prepare = prepare
        self._api_client = api_client
        self._core = core
        self._crash_limit = crash_limit
        self._custom = custom
        if settings.autoscaler == "keda" and custom is None:
            raise ValueError("autoscaler keda needs the custom objects API")
        self._replicas: dict[VersionKey, int] = {}
        self._failures: dict[VersionKey, str] = {}
        self._loaded_at = -FAILURES_READ_S

    @classmethod
    def connect(
        cls,
        settings: KubernetesSettings,
        worker_env: Mapping[str, str] | None = None,
        prepare: Prepare | None = None,
        crash_limit: int = 5,
    ) -> KubernetesReplicas:
        """The adapter on the cluster `settings` say: the pod's service account
        (`in_cluster`) or the local kubeconfig's current context."""
        load_config: Callable[[], object] = (
            config.load_incluster_config if settings.in_cluster else config.load_kube_config
        )
        load_config()
        api = client.ApiClient()
        apps, policy, core = client.AppsV1Api(api), client.PolicyV1Api(api), client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        return cls(settings, apps, policy, worker_env, prepare, api, core, crash_limit, custom)

    @property
    def autoscaled(self) -> bool:
        """Whether KEDA scales active versions between their bounds (`autoscaler`)."""
        return self._settings.autoscaler == "keda"

    def running(self) -> dict[VersionKey, int]:
        """`spec.replicas` of each managed version's Deployment, as last loaded."""
        return {key: count for key, count in self._replicas.items() if count > 0}

    async def failures(self) -> dict[VersionKey, str]:
        """Versions one of whose pods cannot run (`pod_failure`), read from the API at most
        every `FAILURES_READ_S` (and after each write)."""
        if self._core is not None and time.monotonic() - self._loaded_at >= FAILURES_READ_S:
            await self.load()
        return dict(self._failures)

    async def load(self) -> None:
        """List the managed Deployments of the namespace into the cache `running()` reads;
        Deployments of others (and ones being deleted) are ignored."""
        listed = await asyncio.to_thread(
            self._apps.list_namespaced_deployment,
            self._settings.namespace,
            label_selector=MANAGED_SELECTOR,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        replicas: dict[VersionKey, int] = {}
        by_name: dict[str, VersionKey] = {}
        for item in listed.items or []:
            key = managed_key(item)
            if key is not None:
                replicas[key] = (item.spec.replicas if item.spec is not None else None) or 0
                by_name[item.metadata.name] = key
        self._replicas = replicas
        self._loaded_at = time.monotonic()
        if self._core is not None:
            await self._load_failures(by_name)

    async def _load_failures(self, by_name: Mapping[str, VersionKey]) -> None:
        assert self._core is not None
        pods = await asyncio.to_thread(
            self._core.list_namespaced_pod,
            self._settings.namespace,
            label_selector=MANAGED_SELECTOR,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        failures: dict[VersionKey, str] = {}
        for pod in pods.items or []:
            labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
            key = by_name.get(labels.get(INSTANCE_LABEL, ""))
            reason = pod_failure(pod, self._crash_limit) if key is not None else None
            if key is not None and reason is not None:
                failures[key] = reason
        self._failures = failures

    async def _call(self, method: Callable[..., Any], *args: Any, ok: int = 0) -> bool:
        """Run one API call in a thread; False when it failed with status `ok` (a conflict
        or absence that is fine), raise on any other failure."""
        try:
            await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if not ok or _status(exc) != ok:
                raise
            return False
        return True

    async def start(self, name: str, version: DeploymentVersion) -> None:
        """One more replica of `version`: create its Deployment (and PDB) when it has none,
        else scale it up by one."""
        key = (name, version.version)
        have = self._replicas.get(key)
        if have is None:
            if self._prepare is not None:
                await self._prepare(version)
            await self._create(name, version)
        else:
            await self._scale(worker_name(*key), have + 1)
        await self.load()
        log.info("replica_started", deployment=name, version=version.version, runner="k8s")

    async def _create(self, name: str, version: DeploymentVersion) -> None:
        namespace = self._settings.namespace
        pdb = worker_pdb(name, version, self._settings)
        create_pdb = self._policy.create_namespaced_pod_disruption_budget
        await self._call(create_pdb, namespace, pdb, ok=409)  # 409: it is there already
        deployment = worker_deployment(name, version, self._settings, self._worker_env)
        create = self._apps.create_namespaced_deployment
        if not await self._call(create, namespace, deployment, ok=409):
            # Created since the last load (by an earlier controller): scale it instead.
            await self.load()
            have = self._replicas.get((name, version.version), 0)
            await self._scale(worker_name(name, version.version), have + 1)
        if self._custom is not None and self.autoscaled:
            kafka = KafkaAccess(
                bootstrap_servers=self._settings.keda_kafka_bootstrap,
                aws_region=self._settings.keda_aws_region,
            )
            scaled = scaled_object(
                worker_name(name, version.version), namespace, version_scaling(name, version),
                kafka, self._settings.prometheus_url,
            )  # fmt: skip
            create_scaled = self._custom.create_namespaced_custom_object
            await self._call(create_scaled, *scaled_objects_path(namespace), scaled, ok=409)

    async def _scale(self, object_name: str, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        scale = self._apps.patch_namespaced_deployment_scale
        await self._call(scale, object_name, self._settings.namespace, body)

    async def stop_one(self, key: VersionKey) -> None:
        """One replica fewer: scale the version's Deployment down by one (Kubernetes sends
        one pod's worker SIGTERM, which drains it); the last one deletes the Deployment and
        its PDB (their pods drain the same way)."""
        have = self._replicas.get(key, 0)
        if have <= 0:
            return
        object_name = worker_name(*key)
        if self._custom is not None and self.autoscaled:  # KEDA lets go of it first
            delete_scaled = self._custom.delete_namespaced_custom_object
            namespace = self._settings.namespace
            await self._call(delete_scaled, *scaled_objects_path(namespace), object_name, ok=404)
        if have > 1:
            await self._scale(object_name, have - 1)
        else:
            namespace = self._settings.namespace
            delete = self._apps.delete_namespaced_deployment
            delete_pdb = self._policy.delete_namespaced_pod_disruption_budget
            await self._call(delete, object_name, namespace, ok=404)  # 404: gone already
            await self._call(delete_pdb, object_name, namespace, ok=404)
        await self.load()
        log.info("replica_stopping", deployment=key[0], version=key[1], runner="k8s")

    async def stop_all(self) -> None:
        """The controller stops, its replicas do not: they belong to the cluster, and the
        next controller adopts them (`load()` finds them by their labels). Only the API
        client is closed."""
        if self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
