"""A served model and its pool: configuration shared by the gateway and the batch service."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.tool_parsers import ToolCallParserName

CACHE_SALT_VERSION = "v1"
"""Bumped only to invalidate every team's cached prefixes at once."""


def _salt(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in ("llmq-cache-salt", CACHE_SALT_VERSION, *parts):
        data = part.encode()
        digest.update(len(data).to_bytes(4, "big") + data)  # length-prefixed: no ambiguity
    return digest.hexdigest()


class ReplicaBounds(BaseModel):
    """How many replicas of a version run: at least `min` (the warm floor), at most `max`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(default=1, ge=0)
    max: int = Field(default=1, ge=0)
    target_sequences: float | None = Field(default=None, gt=0)
    """Running sequences per replica an autoscaler aims at (KEDA's running-sequences trigger;
    `llmq plan`'s `sequences_per_replica` at the planned busy share); None: no such trigger."""

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaBounds:
        if self.max < self.min:
            raise ValueError(f"replicas.max ({self.max}) is below replicas.min ({self.min})")
        return self


def version_ref(name: str, version: str | None) -> str | None:
    """`name@version`: how a deployment version is named to callers (`system_fingerprint`)
    and pinned by them (`model`); None without a version."""
    return f"{name}@{version}" if version else None


class Deployment(BaseModel):
    """A model the gateway serves and the pool of workers that runs it."""

    name: str
    """The model name callers use (`model` in requests)."""
    version: str = "1"
    """Which version of the deployment this is (the registry's; `name@version` pins it)."""
    path: str
    """A folder with the model's tokenizer and chat template (the weights may live elsewhere)."""
    pool: str
    """The worker pool whose job topics carry this model's requests."""
    weights_uri: str | None = None
    """Where workers fetch the weights (`s3://bucket/prefix`); None: `path` holds them."""
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """SHA-256 of the weights, checked by workers before they load them."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs per replica (seeding version "1")."""
    tpot_slo_s: float | None = Field(default=None, gt=0)
    """The decode time per output token the workers keep under (None: no cap)."""
    max_model_len: int = 2048
    """Prompt plus output tokens the engine accepts for one request."""
    ttft_slo_s: float = 1.0
    """Interactive requests whose predicted time to first token exceeds this get 429."""
    tool_call_parser: ToolCallParserName | None = None
    """How this model writes tool calls in free text (`hermes`: `<tool_call>{...}</tool_call>`),
    as vLLM's `--tool-call-parser`: needed for `tool_choice: "auto"`, refused without it."""
    replicas: ReplicaBounds = ReplicaBounds()
    """How many replicas the pool controller runs (seeding the registry's version "1")."""
    engine_args: dict[str, Any] = {}
    """Engine settings of the deployment's workers (seeding version "1"; see
    `DeploymentSpec.engine_args`)."""
    shared_cache_teams: dict[str, list[str]] = {}
    """Named sets of teams that share prefix-cache blocks on this model (set name -> teams),
    for example one company-wide system prompt. Every team not listed has a cache of its own:
    its requests never reuse, or reveal through `cached_tokens` or timing, another team's."""

    @model_validator(mode="after")
    def _each_team_in_one_set(self) -> Deployment:
        seen: dict[str, str] = {}
        for name, teams in self.shared_cache_teams.items():
            for team in teams:
                if team in seen and seen[team] != name:
                    raise ValueError(
                        f"team {team!r} is in two shared cache sets: {seen[team]!r}, {name!r}"
                    )
                seen[team] = name
        return self

    @property
    def ref(self) -> str:
        """`name@version`: what responses report as `system_fingerprint`."""
        return f"{self.name}@{self.version}"  # version_ref, never None here

    def cache_salt(self, team: str, client_salt: str | None = None) -> str:
        """The prefix-cache salt of `team`'s requests: derived from the team (or its shared
        set), never from a key. A caller's own `cache_salt` narrows it further (its requests
        share blocks only with requests carrying the same one); it can never widen it."""
        shared = next((n for n, teams in self.shared_cache_teams.items() if team in teams), None)
        base = _salt("shared", shared) if shared is not None else _salt("team", team)
        return base if client_salt is None else _salt("caller", base, client_salt)
