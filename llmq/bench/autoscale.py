"""SIMULATION: a day of seed 000's traffic through the KEDA policy that `llmq k8s render`
writes, against a fixed fleet sized for the peak.

Two layers, both models, not measurements:

1. A replica's capacity: the most requests per second per replica at which a pool of
   `SimulatedGpuEngine` replicas (the step-time model of `llmq bench simulate`, least-loaded
   routing, the seed's prompts) still serves >= 99% of requests within the TTFT and TPOT
   SLOs; found by bisection, a few short step-level runs.
2. The day, in ``step_s`` ticks of a fluid queue: demand follows a two-peak diurnal curve
   (office hours and evening) with the seed's mean (10M requests a day) and peak-to-average
   (2.6); ready replicas serve up to their capacity each, the excess waits (and is late once
   its wait exceeds the TTFT SLO). Every ``polling_s`` the autoscaler computes what the
   ScaledObject's triggers ask for: running sequences per replica (Little's law: served rate
   x request lifetime) against the plan's per-replica target, and interactive lag against
   its threshold (KEDA takes the larger), between the planned bounds; scale-up at most doubles
   a minute, scale-down waits ``scale_down_window_s`` and removes one replica per
   ``scale_down_step_s``. A new replica is ready after ``warm_start_s`` on a warm node (image
   pulled, weights on NVMe) or ``cold_start_s`` on a new one (node, image, 140 GB of weights,
   engine start); the node group keeps ``warm_spare_nodes`` running idle nodes ready, which
   cost GPU-hours like busy ones.

Reported for both fleets: goodput overall and in the peak hour, GPU-hours, busy share at
peak (served load over ready capacity) and cost per million output tokens.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Literal

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

from llmq.bench.simulate import SimulationSettings, run_simulation
from llmq.plan import PRESETS, Plan, plan


class DaySettings(BaseModel):
    """The day, the policy's timings and the nodes (defaults: the seed's 70B pool)."""

    preset: Literal["seed-70b", "seed-8b"] = "seed-70b"
    requests_per_day: PositiveInt = 10_000_000
    peak_to_average: float = Field(default=2.6, ge=1)
    step_s: PositiveFloat = 10.0
    polling_s: PositiveFloat = 15.0
    """KEDA's pollingInterval."""
    warm_start_s: PositiveFloat = 60.0
    """A replica on a warm node: weights from its NVMe (about 25 s for 140 GB) and engine start."""
    cold_start_s: PositiveFloat = 600.0
    """A replica on a new node: node boot, image pull, weights from S3 (112 s at 10 Gb/s at
    best), engine start."""
    warm_spare_nodes: int = Field(default=2, ge=0)
    scale_down_window_s: PositiveFloat = 600.0
    scale_down_step_s: PositiveFloat = 120.0
    interactive_lag_per_replica: PositiveInt = 4
    capacity_rps_per_replica: PositiveFloat | None = None
    """None: measured with the step-level simulator (about 20 s)."""
    calibration_replicas: PositiveInt = 8


class FleetDay(BaseModel):
    fleet: Literal["autoscaled", "fixed"]
    goodput_share: float
    peak_hour_goodput_share: float
    gpu_hours: float
    max_replicas: int
    min_replicas: int
    busy_share_at_peak: float
    usd_per_million_output_tokens: float


class DayReport(BaseModel):
    label: str = "SIMULATION (fluid day over a step-level replica capacity; no GPU)"
    settings: DaySettings
    capacity_rps_per_replica: float
    planned_replicas: int
    fleets: list[FleetDay]
    wall_s: float


def demand_rps(hour: float, mean_rps: float, peak_rps: float) -> float:
    """The diurnal curve: office hours (peak at 11:00) and an evening peak (20:00) over a
    night trough, scaled so that its mean and maximum are the given ones."""
    shape = _bumps(hour)
    mean_shape = sum(_bumps(h / 10) for h in range(240)) / 240
    low = (mean_rps - peak_rps * mean_shape) / (1 - mean_shape)
    return max(0.0, low + (peak_rps - low) * shape)


def _bumps(hour: float) -> float:
    office = math.exp(-(((hour - 11.0) / 2.8) ** 2))
    evening = math.exp(-(((hour - 20.0) / 2.0) ** 2))
    return max(office, evening)


def measure_capacity(result: Plan, replicas: int, iterations: int = 7) -> float:
    """Requests/s per replica at which >= 99% of requests meet both SLOs (bisection)."""
    p = result.input
    t = p.traffic
    low, high = 0.5, 3 * t.peak_rps / result.value("replicas")
    for _ in range(iterations):
        rate = (low + high) / 2
        settings = SimulationSettings(
            model="llama-70b" if p.model.parameters > 20e9 else "llama-8b",
            tensor_parallel=p.tensor_parallel, replicas=replicas, rate=rate * replicas,
            prompt_tokens=t.prompt_tokens, output_tokens=t.output_tokens,
            shared_prefix_tokens=int(t.prompt_tokens * t.prefix_cache_share),
            ttft_slo_s=p.ttft_slo_s, tpot_slo_s=p.tpot_slo_s, warmup_s=12.0, duration_s=20.0,
        )  # fmt: skip
        report = run_simulation(settings)
        good = report.goodput_share or 0.0
        low, high = (rate, high) if good >= 0.99 else (low, rate)
    return low


class _Autoscaler:
    """KEDA over an HPA: the triggers' demand, scale-up at most x2 a minute, slow scale-in."""

    def __init__(self, s: DaySettings, low: int, high: int, per_replica_seqs: float) -> None:
        self.s, self.low, self.high = s, low, high
        self.per_replica_seqs = per_replica_seqs
        self.recent: deque[tuple[float, int]] = deque()
        self.last_down = -math.inf

    def desired(self, now: float, current: int, running_seqs: float, lag: float) -> int:
        by_seqs = math.ceil(running_seqs / self.per_replica_seqs - 1e-9)
        by_lag = math.ceil(lag / self.s.interactive_lag_per_replica - 1e-9)
        want = min(self.high, max(self.low, by_seqs, by_lag))
        self.recent.append((now, want))
        while self.recent and self.recent[0][0] < now - self.s.scale_down_window_s:
            self.recent.popleft()
        if want > current:
            return min(want, max(current * 2, current + 4))
        stable = max(w for _, w in self.recent)  # the window's highest wish
        if stable < current and now - self.last_down >= self.s.scale_down_step_s:
            self.last_down = now
            return current - 1
        return current


def simulate_day(s: DaySettings, capacity: float, result: Plan, fixed: bool) -> FleetDay:
    p = result.input
    per_node = p.gpu.gpus_per_node // p.tensor_parallel
    mean = s.requests_per_day / 86_400
    peak = mean * s.peak_to_average
    lifetime = result.value("request_lifetime_s")
    low = int(result.value("min_replicas"))
    high = int(result.value("max_replicas"))
    planned = int(result.value("replicas"))
    scaler = _Autoscaler(s, low, high, result.value("sequences_per_replica"))
    start = planned if fixed else low
    ready: list[float] = [0.0] * start  # when each replica is (or was) ready
    spare_ready_at = [0.0] * (s.warm_spare_nodes * per_node)
    backlog = offered = good = peak_offered = peak_good = served_total = 0.0
    gpu_seconds = busy_at_peak = 0.0
    replicas_seen = [start]
    next_poll = 0.0
    peak_hour = max(range(24), key=lambda h: demand_rps(h + 0.5, mean, peak))
    now = 0.0
    while now < 86_400:
        rate = demand_rps(now / 3600, mean, peak)
        n_ready = sum(1 for r in ready if r <= now)
        capacity_now = n_ready * capacity
        served = min(rate + backlog / s.step_s, capacity_now)
        backlog = max(0.0, backlog + (rate - capacity_now) * s.step_s)
        wait = backlog / capacity_now if capacity_now else math.inf
        arrived = rate * s.step_s
        on_time = arrived if wait <= p.ttft_slo_s * 0.5 else 0.0  # half the SLO: queue only
        offered += arrived
        good += on_time
        served_total += served * s.step_s
        in_peak_hour = peak_hour * 3600 <= now < (peak_hour + 1) * 3600
        if in_peak_hour:
            peak_offered += arrived
            peak_good += on_time
            busy_at_peak = max(busy_at_peak, served / capacity_now if capacity_now else 1.0)
        nodes = math.ceil(len(ready) / per_node) + (0 if fixed else s.warm_spare_nodes)
        gpu_seconds += nodes * p.gpu.gpus_per_node * s.step_s
        if not fixed and now >= next_poll:
            next_poll = now + s.polling_s
            want = scaler.desired(now, len(ready), served * lifetime, backlog)
            while len(ready) < want:
                warm = [i for i, t in enumerate(spare_ready_at) if t <= now]
                if warm:  # a warm slot: its node re-provisions a new spare behind it
                    spare_ready_at[warm[0]] = now + s.cold_start_s
                    ready.append(now + s.warm_start_s)
                else:
                    ready.append(now + s.cold_start_s)
            while len(ready) > want:
                ready.pop()  # the newest first; its streams drain (within the step)
            replicas_seen.append(len(ready))
        now += s.step_s
    gpu_hours = gpu_seconds / 3600
    out_tokens = served_total * p.traffic.output_tokens
    return FleetDay(
        fleet="fixed" if fixed else "autoscaled",
        goodput_share=good / offered,
        peak_hour_goodput_share=peak_good / peak_offered if peak_offered else 1.0,
        gpu_hours=gpu_hours,
        max_replicas=max(replicas_seen),
        min_replicas=min(replicas_seen),
        busy_share_at_peak=busy_at_peak,
        usd_per_million_output_tokens=gpu_hours * p.gpu.usd_per_hour / out_tokens * 1e6,
    )


def run_day(s: DaySettings) -> DayReport:
    started = time.perf_counter()
    base = PRESETS[s.preset].model_copy(deep=True)
    base.traffic.peak_rps = s.requests_per_day / 86_400 * s.peak_to_average
    base.traffic.peak_to_average = s.peak_to_average
    result = plan(base)
    capacity = s.capacity_rps_per_replica or measure_capacity(result, s.calibration_replicas)
    fleets = [simulate_day(s, capacity, result, fixed) for fixed in (False, True)]
    return DayReport(
        settings=s,
        capacity_rps_per_replica=capacity,
        planned_replicas=int(result.value("replicas")),
        fleets=fleets,
        wall_s=time.perf_counter() - started,
    )


def format_day(report: DayReport) -> str:
    s = report.settings
    lines = [
        report.label,
        f"{s.preset}: {s.requests_per_day:,} requests a day, peak-to-average "
        f"{s.peak_to_average:g}; a replica serves {report.capacity_rps_per_replica:.2f} req/s "
        f"within the SLOs; plan: {report.planned_replicas} replicas at peak; start-up "
        f"{s.warm_start_s:g} s warm / {s.cold_start_s:g} s cold, {s.warm_spare_nodes} warm "
        "spare nodes",
        f"{'fleet':<12}{'goodput':>9}{'peak hour':>11}{'GPU-hours':>11}{'replicas':>11}"
        f"{'busy@peak':>11}{'$/M out':>9}",
    ]
    for f in report.fleets:
        lines.append(
            f"{f.fleet:<12}{f.goodput_share:>9.2%}{f.peak_hour_goodput_share:>11.2%}"
            f"{f.gpu_hours:>11,.0f}{f'{f.min_replicas}-{f.max_replicas}':>11}"
            f"{f.busy_share_at_peak:>11.0%}{f.usd_per_million_output_tokens:>9.3f}"
        )
    lines.append(f"({report.wall_s:.1f} wall s)")
    return "\n".join(lines)
