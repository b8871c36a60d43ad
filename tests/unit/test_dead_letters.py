"""Dead letters say why a record is not a job, keep its bytes, and never its content in words."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from schemas.messages import InferenceJob
from workers.dead_letters import dead_letter_for, reply_address


def letter_for(raw: bytes):  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as caught:
        InferenceJob.model_validate_json(raw)
    return dead_letter_for("llmq.jobs.p.interactive", 3, 42, raw, caught.value)


@pytest.mark.parametrize(
    ("raw", "reason", "request_id"),
    [
        (b"\xff\xfe", "unparseable", None),
        (b'{"request_id": "r1", "type": "inference"}', "unparseable", "r1"),
        (
            json.dumps({"schema_version": 7, "request_id": "r2"}).encode(),
            "unknown_schema_version",
            "r2",
        ),
    ],
)
def test_reason_request_id_and_payload(raw: bytes, reason: str, request_id: str | None) -> None:
    letter = letter_for(raw)
    assert (letter.reason, letter.request_id) == (reason, request_id)
    assert (letter.topic, letter.partition, letter.offset) == ("llmq.jobs.p.interactive", 3, 42)
    assert base64.b64decode(letter.payload_b64) == raw


def test_detail_names_the_problem_not_the_content() -> None:
    secret = b'{"request_id": "r3", "prompt": "my card number is 4111"}'
    letter = letter_for(secret)
    assert "4111" not in letter.detail and "validation error" in letter.detail


@pytest.mark.parametrize(
    ("value", "address"),
    [
        (b'{"request_id": "r1", "reply_to": "llmq:reply:gw1", "schema_version": 2}',
         ("r1", "llmq:reply:gw1")),
        (b'{"request_id": "r1", "reply_to": "llmq.results"}', None),  # a batch line
        (b'{"request_id": 7, "reply_to": "llmq:reply:gw1"}', None),
        (b'["llmq:reply:gw1"]', None),
        (b"\xff not json", None),
        (None, None),
    ],
)  # fmt: skip
def test_reply_address_names_a_waiting_gateway_only(
    value: bytes | None, address: tuple[str, str] | None
) -> None:
    assert reply_address(value) == address
