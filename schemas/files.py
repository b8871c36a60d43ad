"""`/v1/files`: OpenAI's `FileObject`, `FileDeleted` and list shapes (from the openai SDK)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
]
FILE_PURPOSES: frozenset[str] = frozenset(get_args(FilePurpose))
"""Every value `purpose` may take."""


class FileObject(BaseModel):
    """A stored file, as OpenAI describes it."""

    id: str
    bytes: int
    created_at: int
    filename: str
    object: Literal["file"] = "file"
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    deleted: bool
    object: Literal["file"] = "file"


class FileList(BaseModel):
    """One page of `GET /v1/files`; the next page starts `after` `last_id`."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
