"""LoRA adapters: teams' fine-tunes of a shared base deployment, named as models.

An adapter belongs to one team: its name is what that team's requests put in `model`, and no
other team can see or use it (they get the same 404 as for a model that does not exist). Two
teams may each have an adapter of the same name. The registry log (`llmq.registry`) holds one
`AdapterRecord` per (team, name) under the key `adapter_key(team, name)`; deployment names
never hold `:`, so the two kinds of key cannot collide.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.messages import AdapterRef, Message

ADAPTER_KEY_PREFIX = "adapter:"
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""Adapter names: letters, digits, `.`, `_`, `-` (no `/`, `@` or `:`, which name deployments,
pin versions and start admin actions)."""
SHA256_PATTERN = r"^[0-9a-f]{64}$"

AdapterStatus = Literal["ready", "failed"]
"""`ready`: requests may name it (a worker loads it on first use). `failed`: a worker could
not load it (its failure says why); requests naming it get 400 until it is registered again."""


def adapter_key(team: str, name: str) -> str:
    """The registry key of team `team`'s adapter `name`."""
    return f"{ADAPTER_KEY_PREFIX}{team}:{name}"


def is_valid_adapter_name(name: str) -> bool:
    return re.fullmatch(ADAPTER_NAME_PATTERN, name) is not None


def is_adapter_key(key: str) -> bool:
    return key.startswith(ADAPTER_KEY_PREFIX)


class AdapterSpec(BaseModel):
    """What `PUT /v1/adapters/{name}` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: str
    """The deployment the adapter was trained on (its name, not a version)."""
    weights_uri: str = Field(pattern=r"^s3://[^/]+(/.*)?$")
    """The adapter's folder in object storage: `s3://bucket/prefix`, holding a PEFT adapter
    (adapter_config.json and adapter_model.safetensors)."""
    sha256: str = Field(pattern=SHA256_PATTERN)
    """The folder digest, as `llmq weights digest` prints it; checked at registration and by
    every worker before it loads the adapter."""
    rank: int = Field(ge=1, le=1024)
    """The LoRA rank (`r` in adapter_config.json); at most the base's `max_lora_rank`."""
    team: str | None = None
    """The owning team. Team keys may leave it out (their own team) or name their own team;
    admin keys must name one."""


class AdapterRecord(Message):
    """One adapter's whole state at one revision: the value of its key in `llmq.registry`."""

    type: Literal["adapter"] = "adapter"
    name: str = Field(pattern=ADAPTER_NAME_PATTERN)
    team: str
    base: str
    weights_uri: str
    sha256: str = Field(pattern=SHA256_PATTERN)
    rank: int = Field(ge=1)
    created_at: int
    """Unix seconds of its first registration."""
    status: AdapterStatus = "ready"
    failure: str | None = None
    """Why it `failed` (what the worker's engine said); None otherwise."""
    revision: int = Field(default=1, ge=1)
    written_by: str = ""
    updated_at: int = 0

    @property
    def key(self) -> str:
        return adapter_key(self.team, self.name)

    @property
    def ref(self) -> AdapterRef:
        return AdapterRef(
            id=f"{self.team}/{self.name}",
            weights_uri=self.weights_uri,
            sha256=self.sha256,
            rank=self.rank,
        )


class AdapterObject(BaseModel):
    """How the API shows an adapter."""

    id: str
    """Its name: what its team puts in `model`."""
    object: Literal["adapter"] = "adapter"
    owned_by: str
    """The owning team."""
    base: str
    weights_uri: str
    sha256: str
    rank: int
    created_at: int
    status: AdapterStatus
    failure: str | None = None

    @classmethod
    def of(cls, record: AdapterRecord) -> AdapterObject:
        return cls(
            id=record.name,
            owned_by=record.team,
            base=record.base,
            weights_uri=record.weights_uri,
            sha256=record.sha256,
            rank=record.rank,
            created_at=record.created_at,
            status=record.status,
            failure=record.failure,
        )


class AdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterObject]


class AdapterDeleted(BaseModel):
    """OpenAI's deletion shape (as for `DELETE /v1/models/{model}`)."""

    id: str
    object: Literal["adapter"] = "adapter"
    deleted: bool = True
