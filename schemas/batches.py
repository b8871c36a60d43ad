"""The OpenAI Batch API surface: the `batch` object, its create request and list page.

Names and fields follow the openai SDK's ``types/batch.py``, ``batch_error.py``,
``batch_request_counts.py`` and ``batch_create_params.py``, so the SDK's ``client.batches``
works unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
FINAL_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
"""Statuses a batch never leaves."""

BatchEndpoint = Literal["/v1/chat/completions", "/v1/completions"]
BATCH_ENDPOINTS: tuple[BatchEndpoint, ...] = ("/v1/chat/completions", "/v1/completions")
"""The endpoints llmq batches serve; every line of a batch calls its batch's endpoint."""


def endpoint_of(batch: Batch) -> BatchEndpoint:
    """A batch's endpoint (validated at creation: one of `BATCH_ENDPOINTS`)."""
    return "/v1/completions" if batch.endpoint == "/v1/completions" else "/v1/chat/completions"


class BatchError(BaseModel):
    code: str | None = None
    """An error code identifying the error type."""
    line: int | None = None
    """The (1-based) line number of the input file where the error occurred, if applicable."""
    message: str | None = None
    param: str | None = None


class BatchErrors(BaseModel):
    data: list[BatchError] = Field(default_factory=list)
    object: Literal["list"] = "list"


class BatchRequestCounts(BaseModel):
    completed: int = 0
    failed: int = 0
    total: int = 0


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts)
    metadata: dict[str, str] | None = None
    model: str | None = None


class BatchCreateRequest(BaseModel):
    """`POST /v1/batches`; unknown fields are refused, as elsewhere in the API."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
