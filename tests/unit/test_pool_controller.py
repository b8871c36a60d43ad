"""The pool controller's reconcile rounds against a registry (over an in-memory log), a
recording replica runner and a settable backlog."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from control.pool_controller import WEIGHTS_FAILURE, PoolController, VersionKey
from control.registry import DeploymentRegistry, first_record
from schemas.deployment import ReplicaBounds
from schemas.registry import DeploymentRecord, DeploymentVersion, TrafficSplit
from tests.unit.test_registry import MemoryRegistryLog


class RecordingRunner:
    def __init__(self) -> None:
        self.replicas: dict[VersionKey, int] = {}
        self.calls: list[tuple[str, VersionKey]] = []
        self.failed: dict[VersionKey, str] = {}

    async def failures(self) -> dict[VersionKey, str]:
        return dict(self.failed)

    def running(self) -> dict[VersionKey, int]:
        return {k: n for k, n in self.replicas.items() if n}

    async def start(self, name: str, version: DeploymentVersion) -> None:
        key = (name, version.version)
        self.replicas[key] = self.replicas.get(key, 0) + 1
        self.calls.append(("start", key))

    async def stop_one(self, key: VersionKey) -> None:
        self.replicas[key] -= 1
        self.calls.append(("stop", key))


class Backlog:
    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}

    async def queued(self, pool: str, tier: str) -> int:
        return self.waiting.get(pool, 0) if tier == "interactive" else 0


def _version(version: str, pool: str, low: int = 1, high: int = 2) -> DeploymentVersion:
    return DeploymentVersion(
        version=version, path="/m", pool=pool, created_at=1,
        replicas=ReplicaBounds(min=low, max=high),
    )  # fmt: skip


async def _setup() -> tuple[DeploymentRegistry, RecordingRunner, Backlog, PoolController]:
    registry = DeploymentRegistry(MemoryRegistryLog())
    await registry.start()
    runner, backlog = RecordingRunner(), Backlog()
    controller = PoolController(registry, runner, backlog)  # type: ignore[arg-type]
    return registry, runner, backlog, controller


async def test_each_active_version_gets_its_floor_and_a_dead_replica_is_replaced() -> None:
    registry, runner, _, controller = await _setup()
    try:
        record = first_record("m", _version("1", "p1", low=2))
        await registry.update("m", lambda _: record)
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 2}
        runner.replicas[("m", "1")] = 1  # one exited
        await controller.reconcile()
        await controller.reconcile()  # nothing more to do
        assert runner.replicas == {("m", "1"): 2} and len(runner.calls) == 3
    finally:
        await registry.stop()


async def test_with_an_autoscaler_the_controller_keeps_active_versions_within_bounds() -> None:
    registry = DeploymentRegistry(MemoryRegistryLog())
    await registry.start()
    runner, backlog = RecordingRunner(), Backlog()
    controller = PoolController(registry, runner, backlog, autoscaled=True)  # type: ignore[arg-type]
    try:
        await registry.update("m", lambda _: first_record("m", _version("1", "p1", 2, 6)))
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 2}  # the warm floor
        runner.replicas[("m", "1")] = 5  # KEDA scaled it out
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 5} and len(runner.calls) == 2  # left alone
        runner.replicas[("m", "1")] = 8  # above replicas.max (lowered meanwhile)
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 6}
    finally:
        await registry.stop()


async def test_a_draining_version_stops_only_once_its_queue_is_empty_then_retires() -> None:
    registry, runner, backlog, controller = await _setup()
    try:
        record = first_record("m", _version("1", "p1"))
        record = record.model_copy(update={"versions": (*record.versions, _version("2", "p2"))})
        await registry.update("m", lambda _: record)
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 1, ("m", "2"): 1}

        def promote(current: DeploymentRecord | None) -> DeploymentRecord:
            assert current is not None
            old = current.versions[0].model_copy(update={"lifecycle": "draining"})
            return current.model_copy(
                update={"versions": (old, current.versions[1]), "traffic": TrafficSplit(stable="2")}
            )

        await registry.update("m", promote)
        backlog.waiting["p1"] = 3  # jobs still queued for version 1's workers
        await controller.reconcile()
        assert runner.replicas[("m", "1")] == 1
        backlog.waiting["p1"] = 0
        await controller.reconcile()  # stops it
        assert runner.replicas[("m", "1")] == 0
        await controller.reconcile()  # nothing runs it any more: retired
        retired = registry.get("m")
        assert retired is not None
        assert [v.lifecycle for v in retired.versions] == ["retired", "active"]
        assert runner.replicas[("m", "2")] == 1
    finally:
        await registry.stop()


def test_local_engines_are_spread_over_the_cores_least_used_first() -> None:
    from pathlib import Path

    from llmq.controller import ControllerSettings, LocalProcessReplicas
    from llmq.services import ManagedProcess

    replicas = LocalProcessReplicas(ControllerSettings(engine_cores=[0, 1]))
    running: list[ManagedProcess] = []
    replicas._replicas[("m", "1")] = running  # what start() records, without spawning
    picked = []
    for pid in (101, 102, 103):
        core = replicas._free_core()
        assert core is not None
        picked.append(core)
        running.append(ManagedProcess(name=f"w{pid}", pid=pid, port=None, log_path=Path("x")))
        replicas._cores[pid] = core
    assert picked == [0, 1, 0]
    running.pop(0)  # pid 101 (core 0) stopped: core 0 now runs one engine, core 1 one
    running.pop(0)  # pid 102 (core 1) stopped too
    assert replicas._free_core() == 1
    assert LocalProcessReplicas(ControllerSettings(engine_cores=[]))._free_core() is None


async def test_a_canary_whose_replicas_cannot_run_fails_and_its_share_returns_to_stable() -> None:
    registry, runner, _, controller = await _setup()
    try:
        record = first_record("m", _version("1", "p1"))
        record = record.model_copy(
            update={
                "versions": (*record.versions, _version("2", "p2")),
                "traffic": TrafficSplit(stable="1", canary="2", canary_percent=25.0),
            }
        )
        await registry.update("m", lambda _: record)
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 1, ("m", "2"): 1}
        runner.replicas[("m", "2")] = 0  # its replica exited: the weights do not verify
        runner.failed[("m", "2")] = WEIGHTS_FAILURE
        await controller.reconcile()
        await controller.reconcile()
        failed = registry.get("m")
        assert failed is not None
        assert [(v.lifecycle, v.failure) for v in failed.versions] == [
            ("active", None),
            ("failed", WEIGHTS_FAILURE),
        ]
        assert failed.traffic == TrafficSplit(stable="1")
        event = failed.history[-1]
        assert (event.action, event.version, event.by) == ("failed", "2", "controller")
        assert runner.calls.count(("start", ("m", "2"))) == 1  # never restarted
        assert runner.replicas == {("m", "1"): 1, ("m", "2"): 0}
    finally:
        await registry.stop()


async def test_replicas_of_a_failed_version_still_running_are_stopped() -> None:
    registry, runner, _, controller = await _setup()
    try:
        await registry.update("m", lambda _: first_record("m", _version("1", "p1", low=2)))
        await controller.reconcile()
        runner.failed[("m", "1")] = "crash loop"  # a pod in CrashLoopBackOff, one still up
        await controller.reconcile()
        assert runner.replicas == {("m", "1"): 0}
        record = registry.get("m")
        assert record is not None and record.versions[0].lifecycle == "failed"
        assert record.traffic.stable == "1"  # nothing else to serve
    finally:
        await registry.stop()


def _exiting_worker(code: int) -> Any:
    """`start_llmq` for a replica that exits with `code` at once (a real child process)."""
    from llmq.services import spawn

    def start(kind: str, env: dict[str, str], log_path: Path, name: str | None = None) -> Any:
        argv = [sys.executable, "-c", f"raise SystemExit({code})"]
        return spawn(name or kind, argv, log_path)

    return start


async def _exits_of(code: int, starts: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from llmq import controller, starters

    async def no_topics(*_: object) -> None:
        return None

    monkeypatch.setattr(controller, "ensure_topics", no_topics)
    monkeypatch.setattr(starters, "start_llmq", _exiting_worker(code))
    settings = controller.ControllerSettings(
        worker_log_dir=str(tmp_path), engine_cores=[], replica_crash_limit=3
    )
    replicas = controller.LocalProcessReplicas(settings)
    for _ in range(starts):
        await replicas.start("m", _version("1", "p1"))
        (process,) = replicas._replicas[("m", "1")]
        # Wait for its exit without reaping it (the adapter reads its status).
        await asyncio.to_thread(os.waitid, os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        assert replicas.running() == {}
    return await replicas.failures()


async def test_a_local_replica_exiting_with_the_weights_code_fails_its_version_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert await _exits_of(4, 1, monkeypatch, tmp_path) == {("m", "1"): WEIGHTS_FAILURE}


async def test_local_replicas_that_keep_exiting_are_a_crash_loop_at_the_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert await _exits_of(3, 2, monkeypatch, tmp_path) == {}  # restarted: below the limit
    failures = await _exits_of(1, 3, monkeypatch, tmp_path)
    assert failures == {("m", "1"): "crash loop: its replicas exited 3 times within 600 s "
                        "(last exit code 1)"}  # fmt: skip
