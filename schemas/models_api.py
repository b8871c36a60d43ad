"""`GET /v1/models`: OpenAI's `Model` and list shapes, with vLLM's `root` and `parent`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Model(BaseModel):
    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str = "llmq"
    root: str | None = None
    """The base model this one runs on (vLLM's field): itself for a deployment."""
    parent: str | None = None
    """For a LoRA adapter, the deployment it applies to (vLLM's field); None otherwise."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
