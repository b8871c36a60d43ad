"""The load benchmark's aggregation, on synthetic samples (no network: a mock transport)."""

from __future__ import annotations

import email.utils
import json
import random
import sys
import time
from typing import Any

import openai
import pytest
from pydantic import ValidationError

from llmq.bench.load import compare, format_comparison, run_load_async
from llmq.bench.load_model import (
    LoadReport,
    LoadSettings,
    RequestSample,
    busy_share,
    format_report,
    poisson_arrivals,
    retry_after_seconds,
    summarize,
    summarize_group,
)
from llmq.bench.stats import percentile

KEYS = {"a": "sk-a", "b": "sk-b"}


def ok(ttft: float, e2e: float, tokens: int, team: str = "a", **kw: Any) -> RequestSample:
    return RequestSample(
        tier=kw.pop("tier", "interactive"), team=team, stream="s", start_s=kw.pop("start", 0.0),
        ttft_s=ttft, e2e_s=e2e, completion_tokens=tokens, **kw,
    )  # fmt: skip


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    assert ok(0.2, 1.2, 11).tpot_s() == pytest.approx(0.1)
    assert ok(0.2, 0.2, 1).tpot_s() is None


def test_group_percentiles_goodput_and_cache_hits() -> None:
    samples = [
        ok(0.1, 0.1 + 0.02 * 9, 10, prompt_tokens=1000, cached_tokens=800),  # good
        ok(0.3, 0.3 + 0.03 * 9, 10, prompt_tokens=1000, cached_tokens=800),  # good
        ok(0.9, 0.9 + 0.02 * 9, 10, prompt_tokens=1000, cached_tokens=0),  # TTFT over SLO
        ok(0.2, 0.2 + 0.05 * 9, 10, prompt_tokens=1000, cached_tokens=400),  # TPOT over SLO
        ok(0.5, 0.5, 1, prompt_tokens=1000, cached_tokens=0),  # one token: TTFT only, good
        RequestSample(tier="interactive", team="a", stream="s", start_s=0, status="rate_limited",
                      retry_after_s=2.0),
        RequestSample(tier="interactive", team="a", stream="s", start_s=0, status="rate_limited",
                      retry_after_s=4.0),
        RequestSample(tier="interactive", team="a", stream="s", start_s=0, status="error"),
    ]  # fmt: skip
    g = summarize_group("interactive", "a", samples, ttft_slo_s=0.8, tpot_slo_s=0.04)
    assert (g.requests, g.ok, g.rate_limited, g.errors) == (8, 5, 2, 1)
    ttft = [0.1, 0.3, 0.9, 0.2, 0.5]
    assert g.ttft_p50_s == pytest.approx(percentile(ttft, 50))
    assert g.ttft_p95_s == pytest.approx(percentile(ttft, 95))
    assert g.ttft_p99_s == pytest.approx(percentile(ttft, 99))
    assert g.tpot_p50_s == pytest.approx(percentile([0.02, 0.03, 0.02, 0.05], 50))
    assert g.tpot_p99_s == pytest.approx(percentile([0.02, 0.03, 0.02, 0.05], 99))
    assert g.goodput_share == pytest.approx(3 / 8)  # 429s and errors count against goodput
    assert g.cache_hit_rate == pytest.approx(2000 / 5000)
    assert g.retry_after_p50_s == pytest.approx(3.0)
    assert g.drain_s is None


def test_an_empty_or_failed_group_has_no_percentiles() -> None:
    failed = RequestSample(tier="interactive", team="a", stream="s", start_s=0, status="error")
    g = summarize_group("interactive", "a", [failed], 0.8, 0.04)
    assert g.ttft_p95_s is None and g.tpot_p95_s is None and g.cache_hit_rate is None
    assert g.goodput_share == 0.0


def test_batch_drain_runs_from_first_submission_to_last_completion() -> None:
    samples = [
        ok(5.0, 5.0, 64, tier="batch", start=1.0),
        ok(9.0, 9.0, 64, tier="batch", start=1.0),
        RequestSample(tier="batch", team="a", stream="b", start_s=1.0, status="error"),
    ]
    g = summarize_group("batch", "a", samples, 0.8, 0.04)
    assert g.drain_s == pytest.approx(9.0)
    assert (g.ok, g.requests) == (2, 3)


def test_summarize_groups_by_tier_and_team_interactive_first() -> None:
    settings = LoadSettings(api_keys=KEYS, team_a="a", team_b="b", batch_team="a")
    samples = [
        ok(1.0, 2.0, 4, tier="batch"),
        ok(0.1, 0.5, 4, team="b"),
        ok(0.2, 0.6, 4, team="a"),
        ok(0.3, 0.7, 4, team="a"),
    ]
    groups = summarize(settings, samples)
    assert [(g.tier, g.team, g.requests) for g in groups] == [
        ("interactive", "a", 2),
        ("interactive", "b", 1),
        ("batch", "a", 1),
    ]


def test_busy_share_counts_replica_samples_with_running_sequences() -> None:
    snapshots = [[(0, 0.0), (3, 0.5)], [(1, 0.25), (2, 0.25)]]
    busy, kv = busy_share(snapshots)
    assert busy == pytest.approx(0.75)
    assert kv == pytest.approx(0.25)
    assert busy_share([]) == (None, None)


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("1.5") == 1.5
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after_seconds(later) == pytest.approx(30, abs=2)


def test_poisson_arrivals_are_seeded_bounded_and_near_the_rate() -> None:
    a = poisson_arrivals(50.0, 20.0, random.Random("x"), limit=10_000)
    b = poisson_arrivals(50.0, 20.0, random.Random("x"), limit=10_000)
    assert a == b and a == sorted(a) and all(0 <= t < 20.0 for t in a)
    assert len(a) == pytest.approx(1_000, rel=0.1)
    assert len(poisson_arrivals(50.0, 20.0, random.Random("x"), limit=7)) == 7
    assert poisson_arrivals(0.0, 20.0, random.Random("x"), limit=7) == []


def test_settings_are_loopback_only_and_need_a_key_per_team() -> None:
    with pytest.raises(ValidationError, match="loopback"):
        LoadSettings(base_url="http://10.0.0.5:8000/v1")
    with pytest.raises(ValidationError, match="no API key for team 'team-b'"):
        LoadSettings(team_flood_rate=5.0)
    assert "api_keys" not in LoadSettings().model_dump()


def _report(ttft_p95_values: list[float], team: str = "a") -> LoadReport:
    settings = LoadSettings(api_keys=KEYS, team_a="a", team_b="b", batch_team="a")
    samples = [ok(t, t + 0.1, 2, team=team) for t in ttft_p95_values]
    return LoadReport(settings=settings, wall_s=1.0, groups=summarize(settings, samples))


def test_compare_passes_within_a_quarter_and_fails_beyond() -> None:
    base = _report([0.2] * 10)
    within = compare("batch flood", "a", base, _report([0.24] * 10))
    beyond = compare("batch flood", "a", base, _report([0.3] * 10))
    assert within.ratio == pytest.approx(1.2) and within.passed is True
    assert beyond.ratio == pytest.approx(1.5) and beyond.passed is False
    missing = compare("team flood", "a", _report([0.2], team="b"), base)
    assert missing.ratio is None and missing.passed is None
    text = format_comparison(beyond)
    assert "FAIL" in text and "1.50" in text and "TTFT p95 (ms)" in text


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _chunk(**fields: Any) -> dict[str, Any]:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return {**base, "choices": [], **fields}


def _http() -> Any:
    """The HTTP library the installed openai SDK is built on (httpx, or httpx2 in 3.x)."""
    return sys.modules[openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]]


def _handler(request: Any) -> Any:
    http = _http()
    body = json.loads(request.content)
    if request.headers["authorization"] == "Bearer sk-b":
        error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
        return http.Response(429, json=error, headers={"retry-after": "7"})
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    tokens = body["max_tokens"]
    delta = [
        _chunk(choices=[{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}])
        for _ in range(tokens)
    ]
    cached = 64 if body["tier"] == "interactive" else 0
    usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens,
             "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    return http.Response(
        200, content=_sse([*delta, _chunk(usage=usage)]),
        headers={"content-type": "text/event-stream"},
    )  # fmt: skip


async def test_a_run_against_a_mock_gateway_fills_every_group() -> None:
    settings = LoadSettings(
        api_keys=KEYS, team_a="a", team_b="b", batch_team="a", duration_s=0.5,
        interactive_rate=40.0, team_flood_rate=20.0, batch_flood=5, max_tokens=4,
        batch_max_tokens=8,
    )  # fmt: skip
    report = await run_load_async(settings, transport=_http().MockTransport(_handler))
    a, b = report.group("interactive", "a"), report.group("interactive", "b")
    batch = report.group("batch", "a")
    assert a is not None and b is not None and batch is not None
    assert a.requests > 5 and a.ok == a.requests and a.errors == 0
    assert a.cache_hit_rate == pytest.approx(0.64)
    assert all(
        s.completion_tokens == 4
        for s in report.samples
        if s.tier == "interactive" and s.team == "a"
    )
    assert b.rate_limited == b.requests > 0 and b.retry_after_p50_s == 7.0
    assert (batch.requests, batch.ok) == (5, 5) and batch.drain_s is not None
    assert "batch backlog: 5/5 completed" in format_report(report)
