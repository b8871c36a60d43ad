"""`llmq plan`: size a model pool from model, GPU and traffic facts, with the seeds' arithmetic.

Every figure comes with its formula, so an operator can rerun the chain for their own traffic
(seed 000, "Back-of-envelope estimates"):

- KV per token = 2 (K and V) x layers x KV heads x head dim x bytes per value;
- KV room per replica = GPU memory x memory utilisation x TP - weights - activation reserve;
- decode floor = weights / TP / (HBM bandwidth x bandwidth efficiency) per step;
- prefill = prompt tokens x 2 x parameters / (TP x peak FLOPS x utilisation);
- compute demand = peak req/s x (uncached prompt tokens + output tokens) x 2 x parameters;
  replicas by compute = demand / one replica's achieved FLOPS / target busy share;
- replicas by memory = sequences in flight (req/s x their lifetime) x KV per sequence / KV room;
- replicas = the larger, GPUs = replicas x TP, nodes = replicas / (GPUs per node / TP);
- cost per million output tokens = GPUs x price per GPU-hour / output tokens per hour.

The plan also gives the pool's autoscaling bounds: at most the peak replicas plus ``headroom``
(spikes, failures), at least the replicas the average load needs (peak / peak-to-average),
never fewer than one per availability zone; its GPU node group's sizes follow from those.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

GB = 1e9


class ModelFacts(BaseModel):
    """A dense decoder's shape."""

    name: str
    parameters: PositiveFloat
    layers: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    bytes_per_parameter: PositiveFloat = 2.0
    """2 for BF16 weights, 1 for FP8."""
    kv_bytes_per_value: PositiveFloat = 2.0
    """2 for a BF16 KV cache, 1 for FP8."""


class GpuFacts(BaseModel):
    """One accelerator and the node that carries it."""

    name: str
    memory_gb: PositiveFloat
    bandwidth_tb_s: PositiveFloat
    dense_tflops: PositiveFloat
    """Dense BF16 peak."""
    usd_per_hour: PositiveFloat
    instance_type: str
    gpus_per_node: PositiveInt = 8


class TrafficFacts(BaseModel):
    """One pool's load at peak."""

    peak_rps: PositiveFloat
    prompt_tokens: PositiveInt
    output_tokens: PositiveInt
    prefix_cache_share: float = Field(default=0.0, ge=0, lt=1)
    """Share of prompt tokens served from the prefix cache (no prefill compute)."""
    peak_to_average: float = Field(default=2.6, ge=1)


class PlanInput(BaseModel):
    """Everything a plan is computed from."""

    pool: str
    model: ModelFacts
    gpu: GpuFacts
    traffic: TrafficFacts
    tensor_parallel: PositiveInt
    ttft_slo_s: PositiveFloat
    tpot_slo_s: PositiveFloat
    expected_ttft_s: PositiveFloat
    """What a request waits for its first token at the planned load (for the in-flight count)."""
    expected_tpot_s: PositiveFloat
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    """vLLM's default share of GPU memory the engine may use."""
    activation_reserve_gb_per_gpu: float = Field(default=4.0, ge=0)
    """Activations, CUDA graphs, communication buffers (the seed's 16 GB per TP-4 replica)."""
    bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1)
    compute_utilization: float = Field(default=0.4, gt=0, le=1)
    target_busy: float = Field(default=0.65, gt=0, le=1)
    """Share of a replica's compute the plan fills at peak, so queues stay short."""
    headroom: float = Field(default=0.3, ge=0)
    """Replicas above the peak plan the autoscaler may add (spikes and failures)."""
    zones: PositiveInt = 3


class Figure(BaseModel):
    """One number of the chain, with how it was computed."""

    key: str
    value: float
    unit: str
    formula: str


class Plan(BaseModel):
    input: PlanInput
    figures: list[Figure]

    def value(self, key: str) -> float:
        return next(f.value for f in self.figures if f.key == key)

    def node_group(self) -> dict[str, object]:
        """The pool's GPU node group for Terraform (`gpu_node_groups` in fleet.auto.tfvars)."""
        p = self.input
        return {
            "instance_type": p.gpu.instance_type,
            "gpus_per_node": p.gpu.gpus_per_node,
            "tensor_parallel": p.tensor_parallel,
            "min_size": int(self.value("min_nodes")),
            "desired_size": int(self.value("nodes")),
            "max_size": int(self.value("max_nodes")),
        }


def plan(p: PlanInput) -> Plan:
    """The seeds' chain of numbers for one pool."""
    m, g, t, tp = p.model, p.gpu, p.traffic, p.tensor_parallel
    weights = m.parameters * m.bytes_per_parameter
    kv_token = 2 * m.layers * m.kv_heads * m.head_dim * m.kv_bytes_per_value
    kv_seq = (t.prompt_tokens + t.output_tokens) * kv_token
    usable = g.memory_gb * GB * p.gpu_memory_utilization * tp
    kv_room = usable - weights - p.activation_reserve_gb_per_gpu * GB * tp
    if kv_room <= kv_seq:
        raise ValueError(f"{m.name} on TP-{tp} {g.name} leaves no room for one sequence's KV")
    per_node = g.gpus_per_node // tp
    if per_node < 1:
        raise ValueError(f"TP-{tp} does not fit a {g.gpus_per_node}-GPU node")
    floor = weights / tp / (g.bandwidth_tb_s * 1e12 * p.bandwidth_efficiency)
    replica_flops = tp * g.dense_tflops * 1e12 * p.compute_utilization
    prefill = t.prompt_tokens * 2 * m.parameters / replica_flops
    tokens = t.peak_rps * (t.prompt_tokens * (1 - t.prefix_cache_share) + t.output_tokens)
    demand = tokens * 2 * m.parameters
    busy = demand / replica_flops
    by_compute = _ceil(busy / p.target_busy)
    lifetime = p.expected_ttft_s + (t.output_tokens - 1) * p.expected_tpot_s
    in_flight = t.peak_rps * lifetime
    by_memory = _ceil(in_flight * kv_seq / kv_room)
    replicas = max(by_compute, by_memory)
    gpus = replicas * tp
    usd_hour = gpus * g.usd_per_hour
    out_hour = t.peak_rps * t.output_tokens * 3600
    high = _ceil(replicas * (1 + p.headroom))
    low = max(p.zones, _ceil(replicas / t.peak_to_average))
    rows: list[tuple[str, float, str, str]] = [
        ("weight_bytes", weights, "B", "parameters x bytes per parameter"),
        ("kv_bytes_per_token", kv_token, "B", "2 x layers x KV heads x head dim x bytes/value"),
        ("kv_bytes_per_sequence", kv_seq, "B", "(prompt + output tokens) x KV per token"),
        ("kv_room_bytes_per_replica", kv_room, "B",
         "GPU memory x utilisation x TP - weights - activation reserve"),
        ("kv_tokens_per_replica", kv_room // kv_token, "tokens", "KV room / KV per token"),
        ("decode_floor_s", floor, "s",
         "weights / TP / (HBM bandwidth x efficiency): one step at batch 1"),
        ("replica_flops", replica_flops, "FLOP/s", "TP x dense peak x utilisation"),
        ("prefill_s", prefill, "s", "prompt tokens x 2 x parameters / replica FLOPS (uncached)"),
        ("compute_tokens_per_s", tokens, "tokens/s",
         "peak req/s x (prompt x (1 - prefix-cache share) + output)"),
        ("demand_flops", demand, "FLOP/s", "tokens/s x 2 x parameters"),
        ("busy_replicas", busy, "replicas", "demand / replica FLOPS"),
        ("replicas_by_compute", by_compute, "replicas", "ceil(busy replicas / target busy)"),
        ("request_lifetime_s", lifetime, "s", "TTFT + (output - 1) x TPOT, as expected"),
        ("sequences_in_flight", in_flight, "sequences", "peak req/s x request lifetime"),
        ("replicas_by_memory", by_memory, "replicas",
         "ceil(in flight x KV per sequence / KV room)"),
        ("replicas", replicas, "replicas", "the larger of the two"),
        ("sequences_per_replica", in_flight / replicas, "sequences", "in flight / replicas"),
        ("kv_use_at_peak", in_flight * kv_seq / (replicas * kv_room), "share",
         "in flight x KV per sequence / (replicas x KV room)"),
        ("gpus", gpus, "GPUs", "replicas x TP"),
        ("nodes", _ceil(replicas / per_node), "nodes", "ceil(replicas / (GPUs per node / TP))"),
        ("usd_per_hour", usd_hour, "USD/h", "GPUs x price per GPU-hour"),
        ("output_tokens_per_hour", out_hour, "tokens/h", "peak req/s x output tokens x 3,600"),
        ("usd_per_million_output_tokens", usd_hour / out_hour * 1e6, "USD",
         "USD per hour / output tokens per hour x 1M (prompt processing included)"),
        ("max_replicas", high, "replicas", "ceil(replicas x (1 + headroom))"),
        ("min_replicas", low, "replicas", "max(zones, ceil(replicas / peak-to-average))"),
        ("min_nodes", _ceil(low / per_node), "nodes", "ceil(min replicas / replicas per node)"),
        ("max_nodes", _ceil(high / per_node), "nodes", "ceil(max replicas / replicas per node)"),
        ("meets_tpot_slo", float(floor <= p.tpot_slo_s), "bool", "decode floor <= TPOT SLO"),
        ("meets_ttft_slo", float(prefill <= p.ttft_slo_s), "bool", "uncached prefill <= TTFT SLO"),
    ]  # fmt: skip
    figures = [Figure(key=k, value=v, unit=u, formula=f) for k, v, u, f in rows]
    return Plan(input=p, figures=figures)


def _ceil(value: float) -> int:
    """Round up, forgiving float noise (49.0000000001 is 49)."""
    return math.ceil(value - 1e-9)


H100 = GpuFacts(name="H100 SXM", memory_gb=80, bandwidth_tb_s=3.35, dense_tflops=989,
                usd_per_hour=2.50, instance_type="p5.48xlarge")  # fmt: skip
PRESETS: dict[str, PlanInput] = {
    "seed-70b": PlanInput(
        pool="llama-70b",
        model=ModelFacts(name="Llama 3 70B", parameters=70e9, layers=80, kv_heads=8, head_dim=128),
        gpu=H100,
        traffic=TrafficFacts(
            peak_rps=300, prompt_tokens=1500, output_tokens=300, prefix_cache_share=0.4
        ),
        tensor_parallel=4,
        ttft_slo_s=1.0,
        tpot_slo_s=0.05,
        expected_ttft_s=0.3,
        expected_tpot_s=0.03,
    ),
    "seed-8b": PlanInput(
        pool="llama-8b",
        model=ModelFacts(name="Llama 3 8B", parameters=8e9, layers=32, kv_heads=8, head_dim=128),
        gpu=H100,
        traffic=TrafficFacts(peak_rps=700, prompt_tokens=1000, output_tokens=50),
        tensor_parallel=1,
        ttft_slo_s=0.3,
        tpot_slo_s=0.05,
        expected_ttft_s=0.1,
        expected_tpot_s=0.01,
    ),
}
"""Seed 000's two pools: the 70B (10M requests a day, 300 req/s at peak, 1,500 prompt / 300
output tokens, 40% of prompt tokens from the prefix cache, TP-4) and the 8B (700 req/s,
about 1,000 prompt / 50 output tokens, one GPU per replica), on H100s at $2.50 an hour."""

_UNITS = {"B": 1 / GB, "FLOP/s": 1e-15}
_SHOWN_UNITS = {"B": "GB", "FLOP/s": "PFLOP/s"}


def format_plan(result: Plan) -> str:
    """The chain as a table: figure, value, formula."""
    p = result.input
    lines = [
        f"pool {p.pool}: {p.model.name} on TP-{p.tensor_parallel} {p.gpu.name} "
        f"({p.gpu.instance_type}), {p.traffic.peak_rps:g} req/s at peak, "
        f"{p.traffic.prompt_tokens} prompt / {p.traffic.output_tokens} output tokens, "
        f"prefix cache {p.traffic.prefix_cache_share:.0%}",
    ]
    for f in result.figures:
        scale = _UNITS.get(f.unit, 1.0)
        unit = _SHOWN_UNITS.get(f.unit, f.unit)
        if f.unit == "B" and f.value < 1e6:
            scale, unit = 1 / 1024, "KiB"
        value = f.value * scale
        shown = f"{value:,.0f}" if value >= 100 else f"{value:,.4g}"
        if f.unit == "bool":
            shown, unit = ("yes" if f.value else "NO"), ""
        lines.append(f"  {f.key:<32}{shown:>14} {unit:<9} {f.formula}")
    return "\n".join(lines)


def plans_json(results: list[Plan]) -> str:
    """Every plan's figures under stable keys (the `--json` output)."""
    return json.dumps(
        {r.input.pool: {f.key: f.value for f in r.figures} for r in results}, indent=2
    )


def write_tfvars(results: list[Plan], path: Path) -> None:
    """The GPU node groups of these pools, as Terraform reads `*.auto.tfvars.json`."""
    groups = {r.input.pool: r.node_group() for r in results}
    path.write_text(json.dumps({"gpu_node_groups": groups}, indent=2) + "\n")
