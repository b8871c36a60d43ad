"""``llmq bench relay``'s printed report: the streaming phases' table, the figures the issue
asks for beside its targets, and the jobs phase."""

from __future__ import annotations

from llmq.bench.engine_alone import outside_engine_share
from llmq.bench.relay import (
    WORKER_RATE,
    RelayReport,
    added_gap_p99_s,
    gateway_tokens_per_core,
    jobs_per_partition,
    worker_core_share,
)
from llmq.bench.stats import fmt_ms, fmt_pct, ratio


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_report(report: RelayReport) -> str:
    """The streaming phases' table, the figures the issue asks for, and the jobs phase."""
    s = report.settings
    idle = ", ".join(f"{k} {v:.3f}" for k, v in sorted(report.idle_cpu_s_per_s.items()))
    lines = [
        f"llmq bench relay: {report.engine}",
        f"model {s.model}, max_tokens {s.max_tokens}, {s.duration_s:g} s per phase, direct "
        f"server {s.max_num_seqs} slots, machine {report.machine}",
        f"idle CPU s per s ({s.idle_s:g} s): {idle or '-'}",
        "CPU columns: CPU s per 1,000 tokens (direct: its server under gateway; worker net of "
        "its idle rate; engine: the simulated engine drained alone; client: this benchmark's)",
        f"{'streams':>7} {'target':<7}{'tok/s':>9}{'reqs':>6}{'errs':>5}{'gap p50 ms':>11}"
        f"{'gap p99 ms':>11}{'gateway':>9}{'gw tok/s/core':>14}{'worker net':>11}"
        f"{'engine':>7}{'tansu':>7}{'valkey':>7}{'client':>7}",
    ]
    for r in report.streaming:
        cpu = r.cpu_s_per_1k
        alone = report.alone(r.streams) if r.target == "llmq" else None
        lines.append(
            f"{r.streams:>7} {r.target:<7}{r.tokens_per_s:>9,.0f}{r.requests:>6}{r.errors:>5}"
            f"{fmt_ms(r.gap_p50_s, 2):>11}{fmt_ms(r.gap_p99_s, 2):>11}"
            f"{_num(cpu.get('gateway', cpu.get('server'))):>9}"
            f"{_num(gateway_tokens_per_core(r), 0):>14}{_num(r.net_cpu_s_per_1k.get('worker')):>11}"
            f"{_num(alone.cpu_s_per_1k if alone else None):>7}"
            f"{_num(cpu.get('tansu')):>7}{_num(cpu.get('valkey')):>7}"
            f"{_num(ratio(r.client_cpu_s * 1000, r.tokens)):>7}"
        )
    lines += [
        "the issue's targets: added inter-token delay p99 (llmq - direct) <= 5 ms; gateway",
        "tokens/s per core >= 20,000; a worker's share of a core at 2,000 tokens/s outside its",
        "engine <= 5% (its CPU net of idle less the engine drained alone; with the engine: net",
        "of idle, and raw):",
    ]
    for llmq in (r for r in report.streaming if r.target == "llmq"):
        direct = report.result("direct", llmq.streams)
        added = None if direct is None else added_gap_p99_s(llmq, direct)
        worker, raw = worker_core_share(llmq), worker_core_share(llmq, net=False)
        outside = outside_engine_share(
            llmq.net_cpu_s_per_1k.get("worker"), report.alone(llmq.streams), WORKER_RATE
        )
        lines.append(
            f"  {llmq.streams} streams: added gap p99 {fmt_ms(added, 2)} ms; gateway "
            f"{_num(gateway_tokens_per_core(llmq), 0)} tok/s per core; worker outside its "
            f"engine {fmt_pct(outside)} of a core (with it {fmt_pct(worker)}, raw {fmt_pct(raw)})"
        )
    lines.append(f"jobs/s (max_tokens 1, {s.jobs_streams} streams, {s.duration_s:g} s):")
    for r in report.jobs:
        per = jobs_per_partition(r, s.partitions)
        extra = f", {per:,.1f} per partition of {s.partitions}" if r.target == "llmq" else ""
        lines.append(
            f"  {r.target}: {r.requests_per_s:,.1f} jobs/s{extra}; {r.errors} errors "
            f"({r.refused} refused)"
        )
    return "\n".join(lines)
