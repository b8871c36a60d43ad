"""`llmq bench overhead --retry-refused`: a refused request is re-sent after its Retry-After,
and its times count from the first send (what its caller waited)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from llmq.bench.stream_request import RequestSample, send_with_retries


def _sender(
    answers: list[RequestSample],
) -> tuple[list[float], Callable[[], Awaitable[RequestSample]]]:
    sent: list[float] = []

    async def send() -> RequestSample:
        sent.append(time.perf_counter())
        return answers[len(sent) - 1].model_copy()

    return sent, send


def _refused(retry_after_s: float | None) -> RequestSample:
    return RequestSample(error="RateLimitError: Error code: 429", retry_after_s=retry_after_s)


def test_a_refusal_is_retried_after_its_retry_after_and_timed_from_the_first_send() -> None:
    served = RequestSample(ttft_s=0.1, e2e_s=0.5, output_tokens=4)
    sent, send = _sender([_refused(0.05), _refused(0.05), served])
    sample = asyncio.run(send_with_retries(send, retries=2))
    assert sample.error is None and sample.refusals == 2 and len(sent) == 3
    waited = sent[2] - sent[0]
    assert waited >= 0.1  # two Retry-Afters of 50 ms
    assert sample.ttft_s == pytest.approx(0.1 + waited, abs=0.01)
    assert sample.e2e_s == pytest.approx(0.5 + waited, abs=0.01)


def test_no_retries_or_none_left_leaves_the_refusal_as_the_measurement() -> None:
    sent, send = _sender([_refused(0.01)])
    sample = asyncio.run(send_with_retries(send, retries=0))
    assert sample.error is not None and sample.refusals == 0 and len(sent) == 1
    sent, send = _sender([_refused(0.01), _refused(0.01)])
    sample = asyncio.run(send_with_retries(send, retries=1))
    assert sample.error is not None and sample.refusals == 1 and len(sent) == 2


def test_other_errors_are_not_retried() -> None:
    failed = RequestSample(error="APIConnectionError: Connection error.")
    sent, send = _sender([failed, RequestSample(ttft_s=0.1)])
    sample = asyncio.run(send_with_retries(send, retries=2))
    assert sample.error is not None and len(sent) == 1
