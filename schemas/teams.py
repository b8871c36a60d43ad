"""A team's policy: its weight between teams and its token quota (configuration shared by the
gateway, which admits requests, and the batch service, which queues batch lines)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class TeamPolicy(BaseModel):
    """What one team may use: its share of the fleet and its token rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(default=1.0, gt=0)
    """The team's share in weighted fair ordering between teams of one priority class."""
    tokens_per_minute: int = Field(default=10_000_000, gt=0)
    """Prompt + completion tokens per minute; the bucket holds one minute's worth (the burst)."""
    key_sha256: list[str] = []
    """SHA-256 hex digests of the team's API keys (the keys themselves are never configured)."""

    @field_validator("key_sha256")
    @classmethod
    def _hex_digests(cls, digests: list[str]) -> list[str]:
        normalized = [digest.strip().lower() for digest in digests]
        for digest in normalized:
            if not _SHA256_HEX.match(digest):
                raise ValueError("key_sha256 entries must be 64 hex characters (SHA-256)")
        return normalized
