"""Batch input validation: every problem reported with its line number."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from batch.validation import MAX_REPORTED_ERRORS, validate

MODELS = {"tiny-llama", "other"}


def request(custom_id: str | None = "a", **changes: object) -> bytes:
    item: dict[str, object] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]},
    }
    if custom_id is None:
        del item["custom_id"]
    item.update(changes)
    return json.dumps(item).encode()


async def lines_of(*lines: bytes) -> AsyncIterator[bytes]:
    for line in lines:
        yield line


async def test_valid_file_counts_requests_and_names_its_model() -> None:
    report = await validate(lines_of(request("a"), b"", request("b"), b"  "), MODELS, 10)
    assert report.ok
    assert report.requests == 2
    assert report.model == "tiny-llama"
    assert report.errors == []


@pytest.mark.parametrize(
    ("line", "code", "param"),
    [
        (b"{not json", "invalid_json_line", None),
        (b"[1, 2]", "invalid_json_line", None),
        (request(None), "missing_required_parameter", "custom_id"),
        (request("x", method="GET"), "invalid_method", "method"),
        (request("x", url="/v1/completions"), "invalid_url", "url"),
        (request("x", body=None), "missing_required_parameter", "body"),
        (request("x", body={"model": "tiny-llama"}), "invalid_request", "body.messages"),
        (
            request("x", body={"model": "nope", "messages": [{"role": "user", "content": "q"}]}),
            "model_not_found",
            "body.model",
        ),
        (
            request(
                "x",
                body={
                    "model": "tiny-llama",
                    "stream": True,
                    "messages": [{"role": "user", "content": "q"}],
                },
            ),
            "invalid_request",
            "body.stream",
        ),
        (request("x", extra=1), "invalid_request", "extra"),
    ],
)
async def test_bad_line_is_reported_with_its_line_number(
    line: bytes, code: str, param: str | None
) -> None:
    report = await validate(lines_of(request("ok"), b"", line), MODELS, 10)
    assert not report.ok
    assert [(e.line, e.code, e.param) for e in report.errors] == [(3, code, param)]


async def test_duplicate_custom_id_and_mixed_models() -> None:
    other = {"model": "other", "messages": [{"role": "user", "content": "q"}]}
    report = await validate(
        lines_of(request("a"), request("a"), request("b", body=other)), MODELS, 10
    )
    assert [(e.line, e.code) for e in report.errors] == [
        (2, "duplicate_custom_id"),
        (3, "mismatched_model"),
    ]


async def test_too_many_requests_and_empty_file() -> None:
    report = await validate(lines_of(*(request(str(i)) for i in range(5))), MODELS, 3)
    assert [(e.line, e.code) for e in report.errors] == [(4, "too_many_requests")]
    empty = await validate(lines_of(b"", b" "), MODELS, 3)
    assert not empty.ok
    assert [e.code for e in empty.errors] == ["empty_file"]


async def test_error_list_is_capped_and_says_how_many_more() -> None:
    bad = [b"{" for _ in range(MAX_REPORTED_ERRORS + 7)]
    report = await validate(lines_of(*bad), MODELS, 1000)
    assert report.error_count == MAX_REPORTED_ERRORS + 7
    assert len(report.errors) == MAX_REPORTED_ERRORS + 1
    assert report.errors[-1].code == "more_errors"
    assert report.errors[-1].message == "7 more errors."
