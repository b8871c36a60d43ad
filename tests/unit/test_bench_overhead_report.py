"""`llmq bench overhead` pools its rounds and shows how each round compared."""

from __future__ import annotations

import pytest

from llmq.bench.overhead import (
    STALL_S,
    OverheadReport,
    OverheadSettings,
    Target,
    summarize,
)
from llmq.bench.overhead_report import format_report, pooled, round_deltas
from llmq.bench.stream_request import RequestSample


def sample(ttft_s: float, gaps: list[float], tokens: int = 0) -> RequestSample:
    """A request whose content chunks came `gaps` apart after its first one."""
    return RequestSample(
        ttft_s=ttft_s,
        itl_s=gaps,
        output_tokens=tokens or len(gaps) + 1,
        usage_reported=True,
        e2e_s=ttft_s + sum(gaps),
    )


def report_of(rounds: dict[Target, list[tuple[float, list[RequestSample]]]]) -> OverheadReport:
    """Levels at concurrency 1: per target, one (wall_s, samples) per round."""
    report = OverheadReport(
        settings=OverheadSettings(concurrency=[1], rounds=max(map(len, rounds.values()))),
        machine="test",
        cpu_count=2,
    )
    for target, runs in rounds.items():
        for index, (wall_s, samples) in enumerate(runs):
            report.levels.append(summarize(target, 1, wall_s, samples, index))
    return report


def test_summarize_counts_stalls_and_the_median_request_rate() -> None:
    steady = sample(0.1, [0.04] * 9)  # 10 tokens in 0.46 s
    stalled = sample(0.1, [0.04] * 8 + [STALL_S + 0.5])  # one gap over the TPOT SLO
    level = summarize("direct", 1, 2.0, [steady, stalled, steady])

    assert level.stalls == 1
    assert level.request_tokens_per_s_p50 == pytest.approx(10 / 0.46)
    assert level.tokens_per_s == pytest.approx(30 / 2.0)


def test_pooled_sums_wall_time_and_takes_percentiles_over_every_request() -> None:
    report = report_of(
        {
            "direct": [(1.0, [sample(0.10, [0.04] * 4)]), (3.0, [sample(0.30, [0.04] * 4)])],
            "llmq": [(2.0, [sample(0.12, [0.04] * 4)])],
        }
    )

    both = pooled(report, "direct", 1)
    assert both is not None and both.round is None
    assert both.tokens_per_s == pytest.approx(10 / 4.0)  # 2 x 5 tokens over 1 s + 3 s
    assert both.ttft_p50_s == pytest.approx(0.20)
    single = pooled(report, "llmq", 1)
    assert single is not None and single.round == 0
    assert pooled(report, "llmq", 16) is None


def test_round_deltas_pair_the_targets_round_by_round() -> None:
    report = report_of(
        {
            "direct": [(1.0, [sample(0.100, [0.04] * 4)]), (1.0, [sample(0.100, [0.04] * 4)])],
            "llmq": [(1.25, [sample(0.105, [0.04] * 4)]), (0.5, [sample(0.120, [0.04] * 4)])],
        }
    )

    deltas = round_deltas(report, 1)
    assert [round(d, 3) for d, _ in deltas] == [0.005, 0.020]
    assert [r for _, r in deltas] == pytest.approx([0.8, 2.0])
    table = format_report(report)
    assert "TTFT p50 llmq-direct (ms) +5.0 +20.0 (median +12.5)" in table
    assert "output tok/s llmq/direct 0.80 2.00 (median 1.40)" in table
    assert "2 rounds" in table


def test_a_single_round_prints_no_round_lines() -> None:
    report = report_of(
        {"direct": [(1.0, [sample(0.1, [0.04])])], "llmq": [(1.0, [sample(0.1, [0.04])])]}
    )
    assert "by round" not in format_report(report)
