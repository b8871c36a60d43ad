"""The table `llmq bench overhead` prints, and its JSON report.

Each (target, concurrency) row pools every round: its requests' percentiles, and output
tokens over the rounds' summed wall time. Below the table, each round's llmq/direct ratios
(TTFT p50 delta, output tokens/s) with their median, so one lucky or unlucky round cannot
pass for the result.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import median

from llmq.bench.overhead import LevelResult, OverheadReport, Target, summarize
from llmq.bench.stats import ratio

_ROWS: tuple[tuple[str, str, float], ...] = (
    ("TTFT p50 (ms)", "ttft_p50_s", 1000.0),
    ("TTFT p99 (ms)", "ttft_p99_s", 1000.0),
    ("ITL p50 (ms)", "itl_p50_s", 1000.0),
    ("ITL p99 (ms)", "itl_p99_s", 1000.0),
    ("TPOT p50 (ms)", "tpot_p50_s", 1000.0),
    ("E2E p50 (ms)", "e2e_p50_s", 1000.0),
    ("output tok/s", "tokens_per_s", 1.0),
    ("req tok/s p50", "request_tokens_per_s_p50", 1.0),
    ("stalls >100ms", "stalls", 1.0),
    ("mean out tokens", "mean_output_tokens", 1.0),
    ("errors", "errors", 1.0),
)


def pooled(report: OverheadReport, target: Target, concurrency: int) -> LevelResult | None:
    """Every round of one target at one level as one result (None when it never ran)."""
    rounds = report.rounds(target, concurrency)
    if not rounds:
        return None
    if len(rounds) == 1:
        return rounds[0]
    samples = [sample for level in rounds for sample in level.samples]
    wall_s = sum(level.wall_s for level in rounds)
    return summarize(target, concurrency, wall_s, samples, round_index=None)


def round_deltas(report: OverheadReport, concurrency: int) -> list[tuple[float, float]]:
    """Per round in which both targets ran: (llmq TTFT p50 - direct's, in seconds;
    llmq output tokens/s over direct's)."""
    deltas: list[tuple[float, float]] = []
    for llmq, direct in zip(
        report.rounds("llmq", concurrency), report.rounds("direct", concurrency), strict=False
    ):
        ttft = (
            None
            if llmq.ttft_p50_s is None or direct.ttft_p50_s is None
            else llmq.ttft_p50_s - direct.ttft_p50_s
        )
        throughput = ratio(llmq.tokens_per_s, direct.tokens_per_s)
        if ttft is not None and throughput is not None:
            deltas.append((ttft, throughput))
    return deltas


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _value(result: LevelResult | None, field: str, scale: float) -> float | None:
    raw = getattr(result, field) if result is not None else None
    return None if raw is None else float(raw) * scale


def round_lines(report: OverheadReport, concurrency: int) -> list[str]:
    """Each round's llmq-minus-direct TTFT p50 and llmq/direct output tokens/s, and medians."""
    deltas = round_deltas(report, concurrency)
    if len(deltas) < 2:
        return []
    ttft = " ".join(f"{d * 1000:+.1f}" for d, _ in deltas)
    speed = " ".join(f"{r:.2f}" for _, r in deltas)
    return [
        f"{concurrency:>4}  by round: TTFT p50 llmq-direct (ms) {ttft} "
        f"(median {median(d for d, _ in deltas) * 1000:+.1f})",
        f"{concurrency:>4}  by round: output tok/s llmq/direct {speed} "
        f"(median {median(r for _, r in deltas):.2f})",
    ]


def format_report(report: OverheadReport) -> str:
    """A plain table: one row per (concurrency, metric); columns direct, llmq, llmq/direct."""
    s = report.settings
    rounds = f", {s.rounds} rounds" if s.rounds > 1 else ""
    lines = [
        f"llmq bench overhead: model {s.model}, max_tokens {s.max_tokens}, "
        f"{s.requests} requests per level{rounds}, machine {report.machine}",
        f"{'conc':>4}  {'metric':<16}{'direct':>10}{'llmq':>10}{'llmq/direct':>13}",
    ]
    for concurrency in dict.fromkeys(s.concurrency):
        direct, llmq = pooled(report, "direct", concurrency), pooled(report, "llmq", concurrency)
        for label, field, scale in _ROWS:
            a, b = _value(direct, field, scale), _value(llmq, field, scale)
            if field == "errors" and not a and not b:
                continue
            lines.append(
                f"{concurrency:>4}  {label:<16}{_cell(a):>10}{_cell(b):>10}"
                f"{_cell(ratio(b, a), 2):>13}"
            )
        lines.extend(round_lines(report, concurrency))
    lines.extend(error_lines(report))
    if report.direct_startup_s is not None:
        lines.append(f"(direct vLLM server started in {report.direct_startup_s:.1f} s)")
    return "\n".join(lines)


def error_lines(report: OverheadReport) -> list[str]:
    """What the failed requests of each level said, most frequent first (count x message)."""
    lines: list[str] = []
    for level in report.levels:
        said = Counter(s.error[:200] for s in level.samples if s.error is not None)
        for message, count in said.most_common(3):
            lines.append(
                f"errors, {level.target} at concurrency {level.concurrency}: {count} x {message}"
            )
    return lines


def write_json(report: OverheadReport, path: Path) -> None:
    """The whole report, raw per-request samples included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.model_dump_json(indent=2) + "\n")
