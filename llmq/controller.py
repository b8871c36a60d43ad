"""`llmq controller`: the pool controller, which keeps each version's replicas at what the
registry asks (`LLMQ_REPLICA_RUNNER`: `local` runs them as `llmq worker` processes on this
machine, what `llmq dev up` uses; `kubernetes` as Deployments), and the rollout controller,
which steps, promotes or rolls back each canary on its arm's measurements."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import structlog
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from control.k8s_manifests import KubernetesSettings, version_env
from control.pool_controller import WEIGHTS_FAILURE, PoolController, VersionKey, crash_loop
from control.registry import DeploymentRegistry
from control.rollout import RolloutController
from llmq.probes import ProbeServer
from schemas.deployment import Deployment
from schemas.registry import DeploymentVersion
from topics.kafka import KafkaProducer, ensure_topics
from topics.kafka_connection import KafkaConnection, configure_kafka
from topics.kafka_registry import KafkaRegistryLog, ensure_registry_topic
from topics.redis_arm_stats import RedisArmStats
from topics.redis_backlog import RedisBacklog
from topics.redis_client import connect_redis
from workers.exit_codes import WEIGHTS_EXIT_CODE

if TYPE_CHECKING:
    from control.kubernetes_replicas import KubernetesReplicas

log = structlog.get_logger()


class ControllerSettings(BaseSettings):
    """The pool controller process; built once at start-up."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers (the registry and the job topics)."""
    kafka_connection: KafkaConnection = KafkaConnection()
    """How the Kafka clients connect (`LLMQ_KAFKA_CONNECTION`, JSON): plaintext locally,
    `{"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "aws_region": ...,
    "replication_factor": 3}` on MSK with IAM."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis (the pools' waiting backlog, which a draining version must empty first)."""
    deployments: list[Deployment] = []
    """The seed of an empty registry (the gateway's `LLMQ_DEPLOYMENTS`)."""
    registry_poll_ms: int = 250
    """How long one read of the registry log waits for new records."""
    probe_port: int | None = None
    """Port for plain-HTTP `/healthz` and `/readyz` (Kubernetes probes); None: not served."""
    probe_host: str = "127.0.0.1"
    """Address the probe port listens on (0.0.0.0 in a pod)."""
    managed_deployments: list[str] = []
    """The deployments whose replicas this controller runs (JSON list); empty: every one in
    the registry. Several controllers can split a registry this way (one per cluster)."""
    reconcile_interval_s: float = 1.0
    """How often desired and running replicas are compared."""
    rollout_interval_s: float = 2.0
    """How often each canary's arm is judged against the stable one's (step, promote or
    roll back)."""
    worker_env: dict[str, str] = {}
    """`LLMQ_*` (and engine) environment every worker gets (JSON object): Kafka, Redis, the
    engine, its KV cache; the version adds its model, path, pool, context and precision."""
    worker_log_dir: str = ".llmq/run/logs"
    """Where each worker's log goes (`<replica id>.log`)."""
    job_topic_partitions: int = 8
    """Partitions of job topics created for a version's pool that has none yet."""
    stop_timeout_s: float = Field(default=90.0, gt=0)
    """How long a stopped worker may drain before it is killed."""
    log_json: bool = False
    """JSON logs (production) instead of console logs (development)."""
    engine_cores: list[int] = Field(default_factory=lambda: sorted(os.sched_getaffinity(0)))
    """Local adapter: the CPU cores its vLLM workers' engines are spread over, one core per
    engine, the least-used first (JSON list; default: every core of this process). Left to
    itself, each CPU engine binds its threads to the first core, so a second engine on the
    machine (another model, a version rolling out) would share that core with the first,
    measured starving a starting engine for minutes, while the other core idled."""
    replica_crash_limit: int = Field(default=5, ge=1)
    """A version whose replicas exit this many times within `replica_crash_window_s` (local
    adapter), or one of whose pods restarted this many times and is in `CrashLoopBackOff`
    (Kubernetes), is in a crash loop: it is marked `failed`, not restarted again."""
    replica_crash_window_s: float = Field(default=600.0, gt=0)
    """The window of `replica_crash_limit` (local adapter)."""
    replica_runner: Literal["local", "kubernetes"] = "local"
    """Where replicas run: `local`, as worker processes on this machine (`llmq dev up`);
    `kubernetes`, as a Deployment per version in a cluster (its `LLMQ_K8S_*` settings)."""


class LocalProcessReplicas:
    """The `ReplicaRunner` of one machine: a worker process per replica."""

    autoscaled = False
    """Nothing but the controller starts local workers."""

    def __init__(self, settings: ControllerSettings) -> None:
        from llmq.services import ManagedProcess

        self._settings = settings
        self._replicas: dict[VersionKey, list[ManagedProcess]] = {}
        self._cores: dict[int, int] = {}
        """The core each running worker's engine is bound to, by process id."""
        self._stopping = ThreadPoolExecutor(max_workers=8, thread_name_prefix="llmq-stop")
        self._exits: dict[VersionKey, list[tuple[float, int | None]]] = {}
        """When each version's replicas exited on their own, and with what status."""

    def running(self) -> dict[VersionKey, int]:
        from llmq.services import exit_code, is_alive

        for key, processes in self._replicas.items():
            exited = [p for p in processes if not is_alive(p.pid)]
            for process in exited:
                code = exit_code(process.pid)
                log.warning(
                    "replica_exited",
                    deployment=key[0],
                    version=key[1],
                    pid=process.pid,
                    exit_code=code,
                    log_path=str(process.log_path),
                )
                self._exits.setdefault(key, []).append((time.monotonic(), code))
                processes.remove(process)
        return {key: len(processes) for key, processes in self._replicas.items() if processes}

    async def failures(self) -> dict[VersionKey, str]:
        """Versions a replica of which exited with `WEIGHTS_EXIT_CODE`, or whose replicas
        exited `replica_crash_limit` times within `replica_crash_window_s`."""
        limit, window = self._settings.replica_crash_limit, self._settings.replica_crash_window_s
        since = time.monotonic() - window
        failed: dict[VersionKey, str] = {}
        for key, exits in self._exits.items():
            exits[:] = [(at, code) for at, code in exits if at >= since]
            if any(code == WEIGHTS_EXIT_CODE for _, code in exits):
                failed[key] = WEIGHTS_FAILURE
            elif len(exits) >= limit:
                failed[key] = crash_loop(len(exits), f"within {window:.0f} s", exits[-1][1])
        return failed

    def _replica_id(self, pool: str) -> str:
        taken = {p.name for processes in self._replicas.values() for p in processes}
        index = 0
        while f"{pool}-dev-{index}" in taken:
            index += 1
        return f"{pool}-dev-{index}"

    def worker_env(self, name: str, version: DeploymentVersion, replica_id: str) -> dict[str, str]:
        env = version_env(name, version, self._settings.worker_env)
        env["LLMQ_REPLICA_ID"] = replica_id
        return env

    def _free_core(self) -> int | None:
        """The engine core running workers use least (the lowest on a tie)."""
        cores = self._settings.engine_cores
        if not cores:
            return None
        live = {p.pid for processes in self._replicas.values() for p in processes}
        self._cores = {pid: core for pid, core in self._cores.items() if pid in live}
        used = Counter(self._cores.values())
        return min(cores, key=lambda core: (used[core], core))

    async def start(self, name: str, version: DeploymentVersion) -> None:
        from llmq.starters import start_llmq

        bootstrap = self._settings.kafka_bootstrap
        await ensure_topics(bootstrap, [version.pool], self._settings.job_topic_partitions)
        replica_id = self._replica_id(version.pool)
        env = self.worker_env(name, version, replica_id)
        core = None if "VLLM_CPU_OMP_THREADS_BIND" in env else self._free_core()
        if core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        log_path = Path(self._settings.worker_log_dir) / f"{replica_id}.log"
        process = start_llmq("worker", env, log_path, name=replica_id)
        if core is not None:
            self._cores[process.pid] = core
        self._replicas.setdefault((name, version.version), []).append(process)
        log.info(
            "replica_started",
            deployment=name,
            version=version.version,
            replica=replica_id,
            engine_core=core,
        )

    async def stop_one(self, key: VersionKey) -> None:
        from llmq.services import stop

        processes = self._replicas.get(key, [])
        if not processes:
            return
        process = processes.pop()  # the newest first
        loop = asyncio.get_running_loop()
        loop.run_in_executor(self._stopping, stop, process, self._settings.stop_timeout_s)

    async def stop_all(self) -> None:
        from llmq.services import stop

        processes = [p for ps in self._replicas.values() for p in ps]
        self._replicas.clear()
        loop = asyncio.get_running_loop()
        timeout = self._settings.stop_timeout_s
        await asyncio.gather(
            *(loop.run_in_executor(self._stopping, stop, p, timeout) for p in processes)
        )
        self._stopping.shutdown(wait=True)


async def replica_runner(
    settings: ControllerSettings,
) -> LocalProcessReplicas | KubernetesReplicas:
    """The `ReplicaRunner` that `settings.replica_runner` names; the Kubernetes one connected
    (`LLMQ_K8S_*`) and with what runs loaded, so a restarted controller adopts its replicas."""
    if settings.replica_runner == "local":
        return LocalProcessReplicas(settings)
    from control.kubernetes_replicas import KubernetesReplicas

    async def prepare(version: DeploymentVersion) -> None:
        bootstrap, partitions = settings.kafka_bootstrap, settings.job_topic_partitions
        await ensure_topics(bootstrap, [version.pool], partitions)

    runner = await asyncio.to_thread(
        KubernetesReplicas.connect,
        KubernetesSettings(),
        settings.worker_env,
        prepare,
        settings.replica_crash_limit,
    )
    await runner.load()
    return runner


async def serve(settings: ControllerSettings) -> None:
    """Run until SIGTERM or SIGINT. Local replicas are then drained and stopped; Kubernetes
    ones keep running (a restarted controller adopts them)."""
    configure_kafka(settings.kafka_connection)
    client_id = "llmq-controller"
    await ensure_registry_topic(settings.kafka_bootstrap)
    producer = KafkaProducer(settings.kafka_bootstrap, client_id=client_id)
    registry_log = KafkaRegistryLog(
        settings.kafka_bootstrap, producer, client_id, settings.registry_poll_ms
    )
    registry = DeploymentRegistry(registry_log)
    redis = connect_redis(settings.redis_url)
    runner = await replica_runner(settings)
    controller = PoolController(
        registry,
        runner,
        RedisBacklog(redis),
        settings.reconcile_interval_s,
        frozenset(settings.managed_deployments),
        autoscaled=runner.autoscaled,
    )
    rollouts = RolloutController(registry, RedisArmStats(redis), settings.rollout_interval_s)
    probes = None
    if settings.probe_port is not None:

        async def rounds_go_on() -> bool:
            return controller.running and rollouts.running

        probes = ProbeServer(
            settings.probe_host, settings.probe_port, healthy=rounds_go_on, ready=rounds_go_on
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await producer.start()
    await registry_log.start()
    try:
        await registry.start()
        await registry.seed(settings.deployments)
        controller.start()
        rollouts.start()
        if probes is not None:
            await probes.start()
        log.info("controller_started", deployments=len(registry.records))
        await stop.wait()
    finally:
        if probes is not None:
            await probes.stop()
        await rollouts.stop()
        await controller.stop()
        await runner.stop_all()
        await registry.stop()
        await registry_log.stop()
        await producer.stop()
        await redis.aclose()
        log.info("controller_stopped")
