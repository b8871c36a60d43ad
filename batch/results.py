"""Output and error file lines, in OpenAI's batch output format.

A success: ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body":
<chat.completion or text_completion>}, "error": null}``. A line that did not run or failed:
``{"id", "custom_id", "response": null, "error": {"code", "message"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.chat import ChatCompletion, ChatCompletionMessage, Choice
from schemas.completions import Completion, CompletionChoice
from schemas.deployment import version_ref
from schemas.messages import BatchLineRef, BatchResultEvent

OK_PREFIX = b"1"
"""Recorded lines are stored as one flag byte (1 ok, 0 failed) followed by the JSON line."""
FAILED_PREFIX = b"0"


def line_id(batch_id: str, index: int) -> str:
    """The id of a batch request: also its request id on the job topic (deterministic)."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


def result_line(event: BatchResultEvent) -> tuple[bool, bytes]:
    """(ok, the output or error file line) for a worker's result."""
    if event.error_code is not None or event.text is None or event.finish_reason is None:
        return False, error_line(
            event.batch,
            event.request_id,
            event.error_code or "engine_error",
            event.error_message or "The request failed.",
        )
    body: ChatCompletion | Completion
    fingerprint = version_ref(event.model, event.model_version)
    if event.batch.endpoint == "/v1/completions":
        body = Completion(
            id=f"cmpl-{event.request_id}",
            created=int(event.finished_at),
            model=event.model,
            choices=[CompletionChoice(text=event.text, finish_reason=event.finish_reason)],
            usage=event.usage.to_openai(),
            system_fingerprint=fingerprint,
        )
    else:
        body = ChatCompletion(
            id=f"chatcmpl-{event.request_id}",
            created=int(event.finished_at),
            model=event.model,
            choices=[
                Choice(
                    message=ChatCompletionMessage(content=event.text),
                    finish_reason=event.finish_reason,
                )
            ],
            usage=event.usage.to_openai(),
            system_fingerprint=fingerprint,
        )
    line: dict[str, Any] = {
        "id": event.request_id,
        "custom_id": event.batch.custom_id,
        "response": {
            "status_code": 200,
            "request_id": event.request_id,
            "body": body.model_dump(mode="json"),
        },
        "error": None,
    }
    return True, json.dumps(line, separators=(",", ":")).encode()


def error_line(ref: BatchLineRef, request_id: str, code: str, message: str) -> bytes:
    line = {
        "id": request_id,
        "custom_id": ref.custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return json.dumps(line, separators=(",", ":")).encode()


def stored(ok: bool, line: bytes) -> bytes:
    return (OK_PREFIX if ok else FAILED_PREFIX) + line


def unpack(record: bytes) -> tuple[bool, bytes]:
    """A stored record back to (ok, line)."""
    return record[:1] == OK_PREFIX, record[1:]
