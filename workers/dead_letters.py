"""Dead letters: a record that cannot become a job goes to the dead-letter topic, with why.

The record is never run and never blocks its partition: the worker publishes a `DeadLetter`
(the reason, a short detail, where the record was, and its bytes base64-encoded) and moves on.
Only after the dead letter is on the broker does the record's offset count as done, so a crash
in between re-delivers the record rather than losing it. Details never carry content.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from typing import Literal, Protocol

import structlog
from pydantic import ValidationError

from schemas.messages import SCHEMA_VERSION, DeadLetter, InferenceJob
from topics.catalog import is_reply_channel
from topics.ports import DeadLetterSink

log = structlog.get_logger()


class UnreadableTeller(Protocol):
    """Ends the request of a record set aside (the job runner)."""

    async def tell_unreadable(self, request_id: str, reply_to: str) -> None: ...


async def set_aside(
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    error: ValidationError,
    sink: DeadLetterSink,
    teller: UnreadableTeller,
) -> bool:
    """Publish the dead letter of a record that is not a job, then tell its caller if the
    record still names one (best effort: its deadline ends it otherwise). False when the dead
    letter could not be published: keep the offset, a restart re-delivers the record."""
    letter = dead_letter_for(topic, partition, offset, value, error)
    try:
        await sink.publish(letter)
    except Exception as send_error:
        log.warning("dead_letter_failed", offset=offset, error=type(send_error).__name__)
        return False
    log.warning("job_dead_lettered", partition=partition, offset=offset,
                reason=letter.reason, request_id=letter.request_id)  # fmt: skip
    address = reply_address(value)
    if address is not None:
        with contextlib.suppress(Exception):
            await teller.tell_unreadable(*address)
    return True


def dead_letter_for(
    topic: str, partition: int, offset: int, value: bytes | None, error: ValidationError
) -> DeadLetter:
    """Why ``value`` is not a job: an unknown schema version, or a record that does not parse."""
    raw = value or b""
    request_id: str | None = None
    reason: Literal["unparseable", "unknown_schema_version"] = "unparseable"
    detail = f"{error.error_count()} validation error(s); first at {_first_location(error)}"
    try:
        item = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        item = None
        detail = "not JSON"
    if isinstance(item, dict):
        rid = item.get("request_id")
        request_id = rid if isinstance(rid, str) else None
        version = item.get("schema_version")
        if version is not None and version != SCHEMA_VERSION:
            reason = "unknown_schema_version"
            detail = f"schema_version {version!r}; this worker reads {SCHEMA_VERSION}"
    return DeadLetter(
        reason=reason,
        detail=detail,
        request_id=request_id,
        topic=topic,
        partition=partition,
        offset=offset,
        payload_b64=base64.b64encode(raw).decode(),
        failed_at=time.time(),
    )


def reply_address(value: bytes | None) -> tuple[str, str] | None:
    """(request_id, reply channel) of a record that is not a job but still names its caller's
    gateway (a newer schema version, a field this worker does not know): that caller can be
    told at once instead of waiting for its deadline. None for anything else (batch lines
    reply on the results topic; their batch's expiry accounts for them)."""
    try:
        item = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(item, dict):
        return None
    rid, channel = item.get("request_id"), item.get("reply_to")
    if isinstance(rid, str) and isinstance(channel, str) and is_reply_channel(channel):
        return rid, channel
    return None


def _first_location(error: ValidationError) -> str:
    errors = error.errors()
    if not errors:
        return "-"
    return ".".join(str(part) for part in errors[0]["loc"]) or "-"


def dead_letter_for_failing_job(
    job: InferenceJob, topic: str, partition: int, offset: int, failed_runs: int
) -> DeadLetter:
    """A job whose runs keep failing (its workers die, or the engine raises): set it aside."""
    return DeadLetter(
        reason="engine_failed",
        detail=f"{failed_runs} run(s) ended without an outcome",
        request_id=job.request_id,
        topic=topic,
        partition=partition,
        offset=offset,
        payload_b64=base64.b64encode(job.to_bytes()).decode(),
        failed_at=time.time(),
        attempts=failed_runs,
    )
