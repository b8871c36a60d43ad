"""What `llmq bench chaos` counts: outcomes checked against usage records and job runs."""

from __future__ import annotations

from collections import Counter

from llmq.bench.chaos_model import ChaosRequest, tally


def _req(index: int, outcome: str, request_id: str | None) -> ChaosRequest:
    req = ChaosRequest(index=index, stream=True, tier="interactive", started_s=0.0)
    req.outcome = outcome  # type: ignore[assignment]
    req.request_id = request_id
    return req


def test_clean_run_counts_each_outcome_once() -> None:
    requests = [
        _req(0, "completed", "a"),
        _req(1, "completed", "b"),
        _req(2, "interrupted", "c"),
        _req(3, "refused", None),
    ]
    figures = tally(requests, Counter({"a": 1, "b": 1, "c": 1}), {"a": 1, "b": 2})
    assert (figures.sent, figures.completed, figures.interrupted, figures.refused) == (4, 2, 1, 1)
    assert (figures.retried, figures.lost, figures.duplicated, figures.unbilled) == (1, 0, 0, 0)


def test_two_usage_records_are_a_duplicate_and_none_is_a_loss() -> None:
    requests = [_req(0, "completed", "a"), _req(1, "completed", "b"), _req(2, "lost", None)]
    figures = tally(requests, Counter({"a": 2}), {})
    assert figures.duplicated == 1
    assert figures.unbilled == 1  # b was answered but never metered
    assert figures.lost == 2  # the client-side loss plus the unbilled answer


def test_failures_are_grouped_by_code_and_printed_as_lines() -> None:
    failed = _req(0, "failed", "a")
    failed.detail = "engine_failed"
    figures = tally([failed], Counter({"a": 1}), {})
    lines = figures.lines()
    assert "failed: 1" in lines and "failed[engine_failed]: 1" in lines
    assert lines[0] == "sent: 1"
