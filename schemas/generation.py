"""Request fields shared by `/v1/chat/completions` and `/v1/completions`.

OpenAI's sampling fields, vLLM's sampling extensions (as vLLM's OpenAI server accepts them in
the same body), and llmq's routing and metering fields. Each endpoint's request extends
`GenerationRequest` with its prompt (messages, or a prompt) and its own options.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

Tier = Literal["interactive", "batch"]
MAX_CHOICES = 4
"""Most choices (`n`) one request may ask for; each is billed as its own completion."""
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class Strict(BaseModel):
    """Unknown fields are refused (as OpenAI does): a typo never silently changes behaviour."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's extension: with `include_usage`, every chunk carries the usage so far."""


class ResponseFormatText(Strict):
    type: Literal["text"]


class ResponseFormatJSONObject(Strict):
    type: Literal["json_object"]


class JSONSchema(Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatJSONSchema(Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchema


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema,
    Field(discriminator="type"),
]


class StructuredOutputs(Strict):
    """vLLM's own form of constrained decoding (`structured_outputs`): exactly one of `json`
    (a JSON schema), `regex`, `choice`, `grammar` (EBNF) or `json_object`."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, max_length=4096)
    choice: list[str] | None = Field(default=None, min_length=1, max_length=256)
    grammar: str | None = Field(default=None, max_length=65536)
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    """Accepted; llmq's engines always generate JSON without free whitespace."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("regex")
    @classmethod
    def _no_nul(cls, regex: str | None) -> str | None:
        if regex is not None and "\x00" in regex:
            raise ValueError("regex must not contain a NUL character")
        return regex

    @field_validator("json_")
    @classmethod
    def _schema_as_object(cls, schema: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except ValueError as exc:
                raise ValueError("json must be a JSON schema or its JSON text") from exc
            if not isinstance(parsed, dict):
                raise ValueError("json must be a JSON schema object")
            return parsed
        return schema

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [
            name
            for name in ("json_", "regex", "choice", "grammar", "json_object")
            if getattr(self, name) not in (None, False)
        ]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        return self


class GenerationRequest(Strict):
    """Fields every generation request accepts, whatever its prompt."""

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    """vLLM's own constrained decoding; cannot be combined with `response_format` JSON."""
    user: str | None = Field(default=None, max_length=256)
    """Recorded on the usage record (metering by end user); never logged."""
    safety_identifier: str | None = Field(default=None, max_length=256)
    """Recorded on the usage record, like `user` (OpenAI's successor to it)."""
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    """Up to 16 pairs (keys up to 64 characters, values up to 512), recorded on the usage record."""
    service_tier: ServiceTier | None = None
    """Mapped: `flex` runs at llmq's batch tier (cheap, never refused for load, waits), every
    other value at the interactive tier; the response names the tier that served it."""
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    """Requests of a team sharing it are routed to the same worker (its prefix cache)."""
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    """vLLM's extension: requests share prefix-cache blocks only with requests carrying the same
    salt. llmq already salts every request by team; a caller's salt narrows that further."""
    # vLLM's sampling extensions, as its OpenAI server accepts them in the same body.
    top_k: int | None = Field(default=None, ge=-1)
    """Sample from the `top_k` most likely tokens (0 or -1: all)."""
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    min_tokens: int | None = Field(default=None, ge=0)
    """Generate at least this many tokens before EOS or a stop token may end the answer."""
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=1_000_000)
    """vLLM's extension: keep only the last this many prompt tokens (-1: as many as the
    model's context holds)."""
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024)
    """Token id (as a string, OpenAI's form) -> bias from -100 (ban) to 100 (force)."""
    tier: Tier = "interactive"

    @field_validator("n")
    @classmethod
    def _at_most_four_choices(cls, n: int | None, info: ValidationInfo) -> int | None:
        if n is not None and not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be between 1 and {MAX_CHOICES}")
        if n is not None and n > 1 and info.data.get("temperature") == 0:
            raise ValueError(
                "n must be 1 when temperature is 0 (greedy choices are all the same); for "
                "greedy choices use top_k=1 with a temperature above 0"
            )
        return n

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias_by_token_id(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"keys must be token ids, got {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"biases must lie in [-100, 100], got {value}")
        return bias

    @field_validator("metadata")
    @classmethod
    def _metadata_within_openais_caps(cls, meta: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (meta or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("keys are at most 64 characters and values at most 512")
        return meta

    @model_validator(mode="after")
    def _min_tokens_within_max(self) -> GenerationRequest:
        limit = self.output_limit
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _one_kind_of_constraint(self) -> GenerationRequest:
        fmt = self.response_format
        if self.structured_outputs is not None and fmt is not None and fmt.type != "text":
            raise ValueError("give structured_outputs or a JSON response_format, not both")
        return self

    @property
    def effective_tier(self) -> Tier:
        """llmq's `tier` when given, else OpenAI's `service_tier` mapped (`flex`: batch)."""
        if "tier" in self.model_fields_set or self.service_tier is None:
            return self.tier
        return "batch" if self.service_tier == "flex" else "interactive"

    @property
    def sticky_key(self) -> str | None:
        """What keeps a caller's requests on one arm of a canary split: its
        `prompt_cache_key`, else its `user`, else nothing (each request drawn alone)."""
        return self.prompt_cache_key or self.user

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def output_limit(self) -> int | None:
        """The most tokens each choice may generate (None: what the context leaves)."""
        return self.max_tokens

    @property
    def tool_schema(self) -> dict[str, Any] | None:
        """The JSON schema a tool choice constrains the output to (None: no tool call)."""
        return None

    @property
    def logprobs_count(self) -> int | None:
        """None: no log probabilities; N: each token's, with the N most likely alternatives."""
        return None

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def truncate(self, prompt: list[int], max_model_len: int) -> list[int]:
        """The prompt as `truncate_prompt_tokens` asks: its last k tokens."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return prompt
        if keep == -1:
            keep = max_model_len
        return prompt[-keep:] if keep > 0 else prompt
