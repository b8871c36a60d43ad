"""The simulated day: the KEDA policy keeps goodput at the peak with fewer GPU-hours than a
fleet sized for the peak, and it is the start-up delays that decide whether it can."""

from __future__ import annotations

import pytest

from llmq.bench.autoscale import DaySettings, demand_rps, format_day, measure_capacity, run_day
from llmq.plan import PRESETS, plan

CAPACITY = 7.6
"""Requests/s per 70B replica within the SLOs, as `measure_capacity` finds it (7.63)."""


def test_the_day_has_the_seeds_mean_and_peak() -> None:
    mean, peak = 10_000_000 / 86_400, 10_000_000 / 86_400 * 2.6
    day = [demand_rps(minute / 60, mean, peak) for minute in range(1440)]
    assert sum(day) / len(day) == pytest.approx(mean, rel=0.01)
    assert max(day) == pytest.approx(peak, rel=0.01)
    assert min(day) > 0


def test_autoscaling_meets_the_peak_with_fewer_gpu_hours_than_a_fixed_fleet() -> None:
    report = run_day(DaySettings(capacity_rps_per_replica=CAPACITY))
    scaled, fixed = report.fleets
    assert (scaled.fleet, fixed.fleet) == ("autoscaled", "fixed")
    assert scaled.peak_hour_goodput_share >= 0.99 and scaled.goodput_share >= 0.99
    assert fixed.gpu_hours == 25 * 8 * 24  # the plan's 25 nodes all day
    assert scaled.gpu_hours < 0.8 * fixed.gpu_hours
    assert scaled.usd_per_million_output_tokens < fixed.usd_per_million_output_tokens
    assert (scaled.min_replicas, scaled.max_replicas) == (20, 50)  # the floor, the plan
    assert "autoscaled" in format_day(report)


def test_cold_starts_of_hours_without_warm_nodes_miss_the_ramps() -> None:
    slow = DaySettings(capacity_rps_per_replica=CAPACITY, cold_start_s=5400, warm_spare_nodes=0)
    scaled, _ = run_day(slow).fleets
    assert scaled.goodput_share < 0.9


def test_capacity_is_measured_with_the_step_level_simulator() -> None:
    capacity = measure_capacity(plan(PRESETS["seed-70b"]), replicas=4, iterations=4)
    assert 4.0 < capacity < 12.0
