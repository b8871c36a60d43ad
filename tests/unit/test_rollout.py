"""The rollout controller's judgement and its steps: a canary steps 5% -> 25% -> promoted
while its arm is as healthy as the stable one's, and is rolled back on a regression."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from control.registry import DeploymentRegistry, first_record
from control.rollout import ArmSummary, RolloutController, judge, p95
from control.traffic import start_canary
from schemas.registry import DeploymentRecord, DeploymentVersion
from schemas.rollout import ArmSample, Rollout, RolloutPolicy
from tests.unit.test_registry import MemoryRegistryLog


class MemoryArmStats:
    def __init__(self) -> None:
        self.samples: dict[str, list[ArmSample]] = {}

    async def record(self, ref: str, sample: ArmSample) -> None:
        self.samples.setdefault(ref, []).append(sample)

    async def since(self, ref: str, since: float) -> list[ArmSample]:
        return [s for s in self.samples.get(ref, []) if s.at >= since]

    def add(self, ref: str, at: float, n: int, ttft_s: float, failed: int = 0) -> None:
        for i in range(n):
            sample = ArmSample(at=at, ok=i >= failed, ttft_s=ttft_s, tpot_s=0.05)
            self.samples.setdefault(ref, []).append(sample)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


POLICY = RolloutPolicy(min_requests=10, min_step_s=30)


def _summary(n: int, ttft: float, errors: int = 0) -> ArmSummary:
    return ArmSummary(requests=n, errors=errors, ttft_p95_s=ttft, tpot_p95_s=0.05)


@pytest.mark.parametrize(
    ("canary", "outcome"),
    [
        (_summary(5, 0.2), "waiting"),  # too few requests to tell
        (_summary(20, 0.25), "healthy"),  # within 1.5x + 0.1 s of 0.2 s
        (_summary(20, 0.5), "regressed"),  # above 0.4 s
        (_summary(20, 0.2, errors=2), "regressed"),  # 10% failed against 0%
    ],
)
def test_judge(canary: ArmSummary, outcome: str) -> None:
    verdict = judge(_summary(100, 0.2), canary, POLICY)
    assert verdict.outcome == outcome
    assert f"canary: {canary.requests} requests" in verdict.reason


def _version(version: str, pool: str) -> DeploymentVersion:
    return DeploymentVersion(version=version, path="/m", pool=pool, created_at=1)


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()


async def _rollout(clock: Clock, policy: RolloutPolicy = POLICY) -> DeploymentRegistry:
    registry = DeploymentRegistry(MemoryRegistryLog(), now=clock)
    await registry.start()
    record = first_record("m", _version("1", "p1"))
    record = record.model_copy(update={"versions": (*record.versions, _version("2", "p2"))})

    def canary(_: DeploymentRecord | None) -> DeploymentRecord:
        return start_canary(record, "2", Rollout(policy=policy, step_started_at=clock.now))

    await registry.update("m", canary)
    return registry


async def test_a_healthy_canary_steps_to_25_then_is_promoted(clock: Clock) -> None:
    registry = await _rollout(clock)
    stats = MemoryArmStats()
    controller = RolloutController(registry, stats, now=clock)
    try:
        stats.add("m@1", clock.now, 100, 0.2)
        stats.add("m@2", clock.now, 12, 0.22)
        await controller.reconcile()
        held = registry.get("m")
        assert held is not None and held.traffic.canary_percent == 5  # the step lasts 30 s
        clock.now += 31
        await controller.reconcile()
        stepped = registry.get("m")
        assert stepped is not None and stepped.traffic.canary_percent == 25
        await controller.reconcile()  # the old step's requests no longer count
        assert registry.get("m") == stepped
        stats.add("m@1", clock.now, 60, 0.2)
        stats.add("m@2", clock.now, 20, 0.21)
        clock.now += 31
        await controller.reconcile()
        done = registry.get("m")
        assert done is not None and done.traffic.stable == "2" and done.traffic.canary is None
        assert [v.lifecycle for v in done.versions] == ["draining", "active"]
        assert [(e.action, e.percent, e.by) for e in done.history] == [
            ("canary", 5, "operator"),
            ("stepped", 25, "controller"),
            ("promoted", 100, "controller"),
        ]
        assert "canary: 20 requests" in done.history[-1].reason
    finally:
        await registry.stop()


async def test_a_regression_rolls_back_even_a_canary_an_operator_holds(clock: Clock) -> None:
    held = POLICY.model_copy(update={"steps": (20.0,), "auto_promote": False})
    registry = await _rollout(clock, held)
    stats = MemoryArmStats()
    controller = RolloutController(registry, stats, now=clock)
    try:
        stats.add("m@1", clock.now, 50, 0.2)
        stats.add("m@2", clock.now, 15, 0.2)
        clock.now += 600
        await controller.reconcile()  # healthy, but held: no step, no promotion
        record = registry.get("m")
        assert record is not None and record.traffic.canary_percent == 20
        stats.add("m@2", clock.now, 30, 2.0)  # the canary slows down
        await controller.reconcile()
        back = registry.get("m")
        assert back is not None and back.traffic.canary is None and back.traffic.stable == "1"
        assert [v.lifecycle for v in back.versions] == ["active", "draining"]
        assert back.history[-1].action == "rolled_back"
        assert "TTFT p95" in back.history[-1].reason
    finally:
        await registry.stop()


def test_p95_is_nearest_rank_so_one_cold_start_outlier_in_twenty_is_not_it() -> None:
    assert p95([0.05] * 19 + [1.2]) == 0.05
    assert p95([0.05] * 5 + [1.2]) == 1.2  # too few to tell it from a regression
    assert p95([]) is None
