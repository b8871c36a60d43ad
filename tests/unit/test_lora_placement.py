"""The adapter placement simulation: every policy sees the same arrivals, and demand-driven
placement neither pins a flooding adapter to one replica nor loads every adapter everywhere."""

from __future__ import annotations

from llmq.bench.lora_placement import PlacementSettings, format_placement, run_placement

SMALL = PlacementSettings(
    replicas=4, partitions=8, base_rate=20, popular_rate=45, rare_adapters=12,
    flood_at_s=4, warmup_s=6, duration_s=8, max_drain_s=30, seed=0,
)  # fmt: skip


def test_demand_placement_spreads_the_flood_and_keeps_rare_adapters_home() -> None:
    report = run_placement(SMALL)
    by = {p.policy: p for p in report.policies}
    assert list(by) == ["least_loaded", "resident", "affinity", "demand"]
    counts = {p.classes["rare"].requests for p in report.policies}
    assert len(counts) == 1 and counts.pop() > 0  # the same arrivals for every policy
    demand, resident, oblivious = by["demand"], by["resident"], by["least_loaded"]
    # Routing only to where the adapter is pins the flood to one replica.
    assert resident.replicas_per_popular == 1.0
    popular_p95 = demand.classes["popular"].ttft_p95_s
    assert popular_p95 is not None and resident.classes["popular"].ttft_p95_s is not None
    assert popular_p95 < SMALL.ttft_slo_s < resident.classes["popular"].ttft_p95_s
    assert demand.replicas_per_popular > 1.0
    # Ignoring adapters loads each of them everywhere.
    assert demand.loads < oblivious.loads
    assert "demand" in format_placement(report)
