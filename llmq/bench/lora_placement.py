"""SIMULATION: where LoRA adapters' requests go, and what it costs, under four routing policies.

A pool of `SimulatedGpuEngine` replicas with LoRA on (at most ``max_loras`` adapters per step,
``max_cpu_loras`` kept in CPU memory, loads stall the step) serves the same arrivals four times,
in virtual time: a base model's traffic, one popular adapter flooding, and many rarely used
adapters. Each replica owns ``partitions / replicas`` partitions of the job topic, as Kafka
assigns them, and reports a heartbeat every ``heartbeat_interval_s`` (loads and loaded
adapters as of then, as the real gateway sees them). The policies:

- ``least_loaded``: the replica with the fewest outstanding tokens, adapters ignored;
- ``resident``: the least loaded replica that already has the adapter, else the least loaded
  (routing only to where an adapter is: the hotspot llm-d's and AIBrix's users report);
  both baselines add what they sent each replica since its heartbeat to its load, as a
  proxy router knows (llmq's router, in the gateway, uses the heartbeats alone);
- ``affinity``: llmq's `PartitionRouter` without demand (the adapter's home partition,
  bounded load spills it along the ring);
- ``demand``: the same router given each adapter's outstanding jobs (what the gateways count
  in Redis, `AdapterDemand`): a busy adapter spreads by its share of the pool's jobs.

A worker fetches an adapter from object storage onto its disk once (``fetch_s``, the request
waits; other requests do not); the engine's own loads are `workers.engine.sim_lora`'s. Reported
per policy: adapter fetches and loads into CPU memory (the thrash), TTFT p50/p95 and goodput
of each traffic class. Estimates from the step-time model, not measurements.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

from gateway.services.routing import PartitionRouter
from llmq.bench.simulate import GPUS, MODELS
from llmq.bench.stats import fmt_ms, fmt_pct, percentile
from schemas.heartbeat import ReplicaHeartbeat
from workers.engine.sim_lora import LoraTimings
from workers.engine.simulated import ReplicaProfile, SimStepResult, SimulatedGpuEngine

Policy = Literal["least_loaded", "resident", "affinity", "demand"]
TrafficClass = Literal["base", "popular", "rare"]
CLASSES: tuple[TrafficClass, ...] = ("base", "popular", "rare")
POOL, TOPIC = "sim", "llmq.jobs.sim.interactive"


class PlacementSettings(BaseModel):
    """The pool, the adapters' traffic and the policies to compare."""

    gpu: Literal["h100", "h200"] = "h100"
    model: Literal["llama-70b", "llama-8b"] = "llama-8b"
    tensor_parallel: PositiveInt = 1
    replicas: PositiveInt = 8
    partitions: PositiveInt = 16
    max_num_seqs: PositiveInt = 128
    max_loras: PositiveInt = 4
    max_cpu_loras: PositiveInt = 8
    base_rate: float = Field(default=60.0, ge=0)
    """Requests/s for the base model (Poisson)."""
    popular_rate: float = Field(default=60.0, ge=0)
    """Requests/s for the one popular adapter, from ``flood_at_s`` on."""
    flood_at_s: float = Field(default=5.0, ge=0)
    quiet_rate: float = Field(default=1.0, ge=0)
    """The popular adapter's requests/s until ``flood_at_s`` (a team's morning)."""
    rare_adapters: PositiveInt = 24
    rare_rate: float = Field(default=0.2, ge=0)
    """Requests/s for each rarely used adapter."""
    prompt_tokens: PositiveInt = 1_000
    shared_prefix_tokens: int = Field(default=500, ge=0)
    """Leading tokens each model or adapter's requests share (its system prompt)."""
    output_tokens: PositiveInt = 200
    heartbeat_interval_s: PositiveFloat = 0.5
    fetch_s: float = Field(default=0.5, ge=0)
    """Object storage -> a worker's disk, once per adapter and worker."""
    load_s: float = Field(default=0.05, ge=0)
    activate_s: float = Field(default=0.002, ge=0)
    adapter_jobs_per_replica: PositiveInt = 4
    warmup_s: float = Field(default=10.0, ge=0)
    duration_s: PositiveFloat = 40.0
    max_drain_s: PositiveFloat = 120.0
    ttft_slo_s: PositiveFloat = 0.8
    tpot_slo_s: PositiveFloat = 0.04
    policies: list[Policy] = ["least_loaded", "resident", "affinity", "demand"]
    seed: int = 0


class ClassFigures(BaseModel):
    requests: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    goodput_share: float | None


class PolicyFigures(BaseModel):
    policy: Policy
    fetches: int
    """Adapter downloads onto workers' disks."""
    loads: int
    """Adapters read into engines' CPU memory (first uses and reloads after eviction)."""
    activations: int
    replicas_per_popular: float
    """Replicas that held the popular adapter, averaged over heartbeats in the window."""
    classes: dict[str, ClassFigures]
    output_tokens_per_s: float


class PlacementReport(BaseModel):
    label: str = "SIMULATION (no GPU, no model: first-principles step times)"
    settings: PlacementSettings
    policies: list[PolicyFigures]
    wall_s: float


@dataclass(frozen=True)
class _Arrival:
    at: float
    cls: TrafficClass
    adapter: str | None
    prompt: list[int]


@dataclass
class _Record:
    arrival: _Arrival
    first: float | None = None
    done: float | None = None
    generated: int = 0


def _arrivals(s: PlacementSettings) -> list[_Arrival]:
    """The same arrivals for every policy: merged Poisson streams, each source with its own
    shared prompt prefix."""
    rng = random.Random(s.seed)
    end = s.warmup_s + s.duration_s
    sources: list[tuple[TrafficClass, str | None, float, float, float]] = [
        ("base", None, s.base_rate, 0.0, end),
        ("popular", "team-a/popular", s.quiet_rate, 0.0, s.flood_at_s),
        ("popular", "team-a/popular", s.popular_rate, s.flood_at_s, end),
        *(("rare", f"team-{i % 5}/rare-{i}", s.rare_rate, 0.0, end)
          for i in range(s.rare_adapters)),
    ]  # fmt: skip
    shared = min(s.shared_prefix_tokens, s.prompt_tokens - 1)
    out: list[_Arrival] = []
    for index, (cls, adapter, rate, start, stop) in enumerate(sources):
        index = 1 if adapter == "team-a/popular" else index  # one prefix for both phases
        at = start
        while rate > 0 and (at := at + rng.expovariate(rate)) < stop:
            unique = 1_000_000_000 + len(out) * s.prompt_tokens
            prefix = range(index * 1_000_000, index * 1_000_000 + shared)
            tail = range(unique, unique + s.prompt_tokens - shared)
            out.append(_Arrival(at, cls, adapter, [*prefix, *tail]))
    return sorted(out, key=lambda a: a.at)


class _Pool:
    """The replicas, their disks and heartbeats, and one policy's routing."""

    def __init__(self, s: PlacementSettings, policy: Policy) -> None:
        self.s, self.policy = s, policy
        profile = ReplicaProfile(
            gpu=GPUS[s.gpu], model=MODELS[s.model], tensor_parallel=s.tensor_parallel
        )
        timings = LoraTimings(load_s=s.load_s, activate_s=s.activate_s)
        self.engines = [
            SimulatedGpuEngine(profile, max_num_seqs=s.max_num_seqs, name=f"sim-{i}",
                               max_loras=s.max_loras, max_cpu_loras=s.max_cpu_loras,
                               lora_timings=timings)
            for i in range(s.replicas)
        ]  # fmt: skip
        self.router = PartitionRouter(adapter_jobs_per_replica=s.adapter_jobs_per_replica)
        self.on_disk: list[set[str]] = [set() for _ in self.engines]
        self.fetching: list[dict[str, list[tuple[str, _Arrival]]]] = [{} for _ in self.engines]
        self.held = [0] * s.replicas
        """Jobs each worker holds (waiting for a fetch or in its engine)."""
        self.demand: dict[str, int] = defaultdict(int)
        self.fetches = 0
        self.beats: list[ReplicaHeartbeat] = []
        self.sent = [0] * s.replicas
        """Tokens a baseline router sent each replica since its last heartbeat."""

    def heartbeat(self, now: float) -> None:
        self.sent = [0] * self.s.replicas
        self.beats = [
            ReplicaHeartbeat(
                replica_id=engine.name, pool=POOL, model="m", state="ready",
                partitions=tuple(f"{TOPIC}:{p}" for p in range(i, self.s.partitions,
                                                               self.s.replicas)),
                in_flight=self.held[i], outstanding_tokens=engine.outstanding_tokens,
                running=len(engine._running), adapters=engine.stats().adapters, sent_at=now,
            )
            for i, engine in enumerate(self.engines)
        ]  # fmt: skip

    def route(self, request_id: str, arrival: _Arrival) -> int:
        adapter = arrival.adapter
        if self.policy in ("affinity", "demand"):
            decision = self.router.choose(
                pool=POOL, salt="t", prompt_token_ids=arrival.prompt, adapter=adapter,
                partitions=self.s.partitions, replicas=self.beats, topic=TOPIC,
                adapter_demand=self.demand[adapter] if adapter and self.policy == "demand" else 0,
                spread_key=request_id,
            )  # fmt: skip
            return decision.partition % self.s.replicas
        candidates = list(range(self.s.replicas))
        if self.policy == "resident" and adapter is not None:
            holders = [i for i, b in enumerate(self.beats) if adapter in b.adapters]
            candidates = holders or candidates
        replica = min(candidates, key=lambda i: self.beats[i].outstanding_tokens + self.sent[i])
        self.sent[replica] += len(arrival.prompt) + self.s.output_tokens
        return replica


def _run_policy(s: PlacementSettings, policy: Policy, arrivals: list[_Arrival]) -> PolicyFigures:
    pool = _Pool(s, policy)
    engines = pool.engines
    window_end = s.warmup_s + s.duration_s
    stop_at = window_end + s.max_drain_s
    records: dict[str, _Record] = {}
    owner: dict[str, int] = {}
    stepping = [False] * s.replicas
    results: dict[int, SimStepResult] = {}
    # (time, kind, tiebreak, payload): 0 step end, 1 arrival, 2 heartbeat, 3 fetch done
    events: list[tuple[float, int, int, object]] = [(a.at, 1, i, i) for i, a in enumerate(arrivals)]
    events.append((0.0, 2, -1, None))
    heapq.heapify(events)
    counter = len(arrivals)
    pending = window_tokens = 0
    spread_samples: list[int] = []

    def push(at: float, kind: int, payload: object) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (at, kind, counter, payload))

    def submit(replica: int, request_id: str, arrival: _Arrival, now: float) -> None:
        engines[replica].submit(
            request_id, arrival.prompt, s.output_tokens, 0, arrival.adapter, arrival.adapter
        )
        if not stepping[replica]:
            result = engines[replica].step()
            results[replica], stepping[replica] = result, True
            push(now + result.duration_s, 0, replica)

    while events:
        now, kind, _, payload = heapq.heappop(events)
        if now > stop_at or (now >= window_end and pending == 0):
            break
        if kind == 1:
            index = int(payload)  # type: ignore[call-overload]
            arrival = arrivals[index]
            request_id = f"r{index}"
            if arrival.adapter:
                pool.demand[arrival.adapter] += 1
            replica = pool.route(request_id, arrival)
            owner[request_id] = replica
            pool.held[replica] += 1
            if s.warmup_s <= now < window_end:
                records[request_id] = _Record(arrival)
                pending += 1
            adapter = arrival.adapter
            if adapter is None or adapter in pool.on_disk[replica]:
                submit(replica, request_id, arrival, now)
            elif adapter in pool.fetching[replica]:
                pool.fetching[replica][adapter].append((request_id, arrival))
            else:
                pool.fetches += 1
                pool.fetching[replica][adapter] = [(request_id, arrival)]
                push(now + s.fetch_s, 3, (replica, adapter))
        elif kind == 3:
            replica, adapter = payload  # type: ignore[misc]
            pool.on_disk[replica].add(adapter)
            for request_id, arrival in pool.fetching[replica].pop(adapter):
                submit(replica, request_id, arrival, now)
        elif kind == 2:
            pool.heartbeat(now)
            if s.warmup_s <= now < window_end:
                spread_samples.append(sum("team-a/popular" in b.adapters for b in pool.beats))
            push(now + s.heartbeat_interval_s, 2, None)
        else:
            replica = int(payload)  # type: ignore[call-overload]
            result = results.pop(replica)
            if s.warmup_s <= now < window_end:
                window_tokens += len(result.emitted)
            for seq in result.emitted:
                record = records.get(seq.request_id)
                if record is not None and record.first is None:
                    record.first = now
                if seq.state == "done":
                    pool.held[owner.pop(seq.request_id)] -= 1
                    if seq.adapter:
                        pool.demand[seq.adapter] -= 1
                    if record is not None:
                        record.done, record.generated = now, seq.generated
                        pending -= 1
            stepping[replica] = False
            if engines[replica].has_work:
                result = engines[replica].step()
                results[replica], stepping[replica] = result, True
                push(now + result.duration_s, 0, replica)
    return PolicyFigures(
        policy=policy,
        fetches=pool.fetches,
        loads=sum(e.lora.loads for e in engines if e.lora),
        activations=sum(e.lora.activations for e in engines if e.lora),
        replicas_per_popular=sum(spread_samples) / len(spread_samples) if spread_samples else 0,
        classes={c: _class_figures(s, records, c, now) for c in CLASSES},
        output_tokens_per_s=window_tokens / s.duration_s,
    )


def _class_figures(
    s: PlacementSettings, records: dict[str, _Record], cls: TrafficClass, end: float
) -> ClassFigures:
    mine = [r for r in records.values() if r.arrival.cls == cls]
    # A request still without a token at the end counts with its wait so far (a lower bound).
    ttft = [(end if r.first is None else r.first) - r.arrival.at for r in mine]
    good = sum(
        1
        for r in mine
        if r.first is not None
        and r.done is not None
        and r.first - r.arrival.at <= s.ttft_slo_s
        and (r.generated < 2 or (r.done - r.first) / (r.generated - 1) <= s.tpot_slo_s)
    )
    return ClassFigures(
        requests=len(mine),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p95_s=percentile(ttft, 95),
        goodput_share=good / len(mine) if mine else None,
    )


def run_placement(settings: PlacementSettings) -> PlacementReport:
    """Run every policy on the same arrivals."""
    started = time.perf_counter()
    arrivals = _arrivals(settings)
    figures = [_run_policy(settings, policy, arrivals) for policy in settings.policies]
    return PlacementReport(
        settings=settings, policies=figures, wall_s=time.perf_counter() - started
    )


def format_placement(report: PlacementReport) -> str:
    s = report.settings
    lines = [
        report.label,
        f"pool: {s.replicas} x {s.model} on TP-{s.tensor_parallel} {s.gpu.upper()}, "
        f"{s.partitions} partitions, max_num_seqs {s.max_num_seqs}, max_loras {s.max_loras}, "
        f"max_cpu_loras {s.max_cpu_loras}",
        f"load: base {s.base_rate:g} req/s, one popular adapter {s.popular_rate:g} req/s "
        f"from {s.flood_at_s:g} s ({s.quiet_rate:g} before), "
        f"{s.rare_adapters} rare adapters {s.rare_rate:g} req/s each; {s.prompt_tokens} prompt "
        f"/ {s.output_tokens} output tokens; fetch {s.fetch_s:g} s, load {s.load_s:g} s; "
        f"SLO TTFT {s.ttft_slo_s * 1000:g} ms, TPOT {s.tpot_slo_s * 1000:g} ms",
        f"{'policy':<13}{'fetches':>8}{'loads':>7}{'popular on':>11}  "
        + "".join(f"{c + ' TTFT p50/p95 ms':>27}{'good':>7}" for c in CLASSES),
    ]
    for p in report.policies:
        row = f"{p.policy:<13}{p.fetches:>8}{p.loads:>7}{p.replicas_per_popular:>11.1f}  "
        for cls in CLASSES:
            c = p.classes[cls]
            ttft = f"{fmt_ms(c.ttft_p50_s, 0)} / {fmt_ms(c.ttft_p95_s, 0)}"
            row += f"{ttft:>27}{fmt_pct(c.goodput_share):>7}"
        lines.append(row)
    lines.append(f"({report.wall_s:.1f} wall s)")
    return "\n".join(lines)
