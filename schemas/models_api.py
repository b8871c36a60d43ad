"""`GET /v1/models`: OpenAI's `Model` and list shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Model(BaseModel):
    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str = "llmq"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
