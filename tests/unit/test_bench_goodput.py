"""`llmq bench goodput`'s logic: Poisson schedules, goodput counting against both SLOs, the
predictor's error from two scrapes of the gateway's metrics, and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image
from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from llmq.bench.goodput import (
    GoodputReport,
    GoodputSettings,
    arrivals,
    bucket_counts,
    format_report,
    quantile_from_buckets,
    requests_at,
    summarize_rate,
    warm_up_batches,
)
from llmq.bench.plot import write_goodput_plot
from llmq.bench.stream_request import RequestSample


def test_arrivals_are_poisson_at_the_rate_and_repeatable() -> None:
    times = arrivals(4.0, 4_000, seed=3)
    assert times == arrivals(4.0, 4_000, seed=3) and times != arrivals(4.0, 4_000, seed=4)
    assert times[0] == 0.0 and times == sorted(times)
    assert times[-1] / (len(times) - 1) == pytest.approx(0.25, rel=0.05)


def test_a_duration_gives_every_rate_as_many_seconds_of_arrivals() -> None:
    fixed = GoodputSettings(requests=120)
    assert [requests_at(fixed, rate) for rate in (4, 32)] == [120, 120]
    timed = GoodputSettings(requests=120, duration_s=20)
    assert [requests_at(timed, rate) for rate in (0.01, 4, 24, 32)] == [1, 80, 480, 640]
    header = format_report(GoodputReport(settings=timed, machine="m")).splitlines()[0]
    assert "20 s of arrivals" in header and "120 requests" not in header


def test_goodput_counts_only_requests_within_both_slos() -> None:
    settings = GoodputSettings(ttft_slo_s=1.0, tpot_slo_s=0.1)
    samples = [
        RequestSample(ttft_s=0.5, e2e_s=0.5 + 9 * 0.05, output_tokens=10),  # good
        RequestSample(ttft_s=1.5, e2e_s=1.5 + 9 * 0.05, output_tokens=10),  # late first token
        RequestSample(ttft_s=0.5, e2e_s=0.5 + 9 * 0.2, output_tokens=10),  # slow decode
        RequestSample(error="RateLimitError: 429 overloaded"),
        RequestSample(error="APIConnectionError: refused"),
    ]
    result = summarize_rate("llmq", 1.0, 2.0, samples, settings)
    assert (result.offered, result.admitted, result.refused, result.failed) == (5, 4, 1, 1)
    assert result.good == 1 and result.goodput == pytest.approx(0.5)
    assert result.ttft_met == 2  # the slow decode met the TTFT SLO
    assert result.ttft_p50_s == pytest.approx(0.5)


def test_the_predictors_error_comes_from_the_gateways_histogram() -> None:
    metrics = GatewayMetrics()
    metrics.observe_prediction("m", 1.0, 1.0)  # before the level: not counted
    before = bucket_counts(generate_latest(metrics.registry).decode())
    for predicted in (1.05, 1.15, 1.15, 1.4, 3.0):  # errors 0.05, 0.15, 0.15, 0.4, 2.0
        metrics.observe_prediction("m", predicted, 1.0)
    after = bucket_counts(generate_latest(metrics.registry).decode())
    # Interpolated within the bucket, as Prometheus does: the 2.5th of 5 errors lies halfway
    # between the 1 at or below 0.1 and the 3 at or below 0.15.
    assert quantile_from_buckets(before, after, 0.5) == pytest.approx(0.1375)
    assert quantile_from_buckets(before, after, 0.95) == pytest.approx(1.875)
    assert quantile_from_buckets(after, after, 0.5) is None  # nothing observed in between


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    settings = GoodputSettings()
    report = GoodputReport(
        settings=settings,
        machine="test",
        results=[
            summarize_rate(
                t, rate, 10.0, [RequestSample(ttft_s=0.2, e2e_s=1.0, output_tokens=9)] * n, settings
            )
            for t in ("llmq", "direct")
            for rate, n in ((0.5, 5), (1.0, 8), (2.0, 6))
        ],
    )
    path = tmp_path / "goodput.png"
    write_goodput_plot(report, path)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (720, 440)
        assert len(image.getcolors(1 << 20) or []) > 3  # lines and text were drawn


async def test_the_warm_up_sends_its_requests_in_batches_and_ignores_refusals() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if len(seen) % 2:  # every other one refused, as llmq's admission may
            error = {"error": {"message": "busy", "type": "rate_limit_error", "code": "x"}}
            return httpx.Response(429, json=error)
        chunk = {
            "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
        }  # fmt: skip
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = openai.AsyncOpenAI(
        base_url="http://llmq.test/v1", api_key="k", http_client=http, max_retries=0
    )
    await warm_up_batches(client, GoodputSettings(warm_up_requests=10))
    assert seen == ["/v1/chat/completions"] * 10
    seen.clear()
    await warm_up_batches(client, GoodputSettings(warm_up_requests=0))
    assert seen == []
    await client.close()
