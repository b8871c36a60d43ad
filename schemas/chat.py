"""The OpenAI chat completions surface, with OpenAI's names and fields.

Shapes follow the openai SDK's ``types/chat``; ``tier`` is llmq's one extension.
Unknown fields are rejected (as OpenAI does) so a typo never silently changes behaviour.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Tier = Literal["interactive", "batch"]
MAX_CHOICES = 4
"""Most choices (`n`) one request may ask for; each is billed as its own completion."""
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


MessageContent = str | list[TextContentPart]


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: MessageContent
    name: str | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: MessageContent
    name: str | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: MessageContent | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: MessageContent
    tool_call_id: str


ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


def content_text(content: MessageContent | None) -> str:
    """The plain text of a message's content (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's extension: with `include_usage`, every chunk carries the usage so far."""


class ResponseFormatText(_Strict):
    type: Literal["text"]


class ResponseFormatJSONObject(_Strict):
    type: Literal["json_object"]


class JSONSchema(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchema


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema,
    Field(discriminator="type"),
]


_NOT_SERVED = {
    "tools": "tool calling is not served yet",
    "tool_choice": "tool calling is not served yet",
    "functions": "function calling is not served yet",
    "function_call": "function calling is not served yet",
    "audio": "the models served produce text only",
    "web_search_options": "llmq runs no web search",
    "moderation": "llmq runs no moderation",
}
"""OpenAI fields accepted by name but refused when set, with the reason (issue 11 plans to
serve log probabilities and tool calls)."""


class ChatCompletionRequest(_Strict):
    """`POST /v1/chat/completions` body."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    response_format: ResponseFormat | None = None
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
    store: bool | None = None
    """Accepted; llmq stores no completions, so `true` is refused."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """Accepted; no effect on the models served (none of them reasons)."""
    modalities: list[Literal["text", "audio"]] | None = None
    """Only text can be produced: `["text"]` is accepted, audio is refused."""
    parallel_tool_calls: bool | None = None
    """Accepted; no effect (tool calling is not served yet)."""
    verbosity: Literal["low", "medium", "high"] | None = None
    """Accepted; no effect (the models served take no verbosity control)."""
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    """Accepted; no effect: cached prefixes live in the engine's KV memory until evicted."""
    prompt_cache_options: dict[str, Any] | None = None
    """Accepted; no effect (cache breakpoints and lifetimes are the engine's own)."""
    prediction: dict[str, Any] | None = None
    """Accepted; no effect: a predicted output only speeds OpenAI's models up, the answer is
    the same."""
    # OpenAI fields llmq cannot honour (yet): named here so they get a clear 400, not an
    # "unrecognized argument".
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
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
    logprobs: bool | None = None
    """Return each generated token's log probability (`choices[].logprobs.content`)."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """With `logprobs`, also the most likely alternatives at each position."""
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024)
    """Token id (as a string, OpenAI's form) -> bias from -100 (ban) to 100 (force)."""
    tier: Tier = "interactive"

    @field_validator("n")
    @classmethod
    def _at_most_four_choices(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be between 1 and {MAX_CHOICES}")
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

    @field_validator(*_NOT_SERVED)
    @classmethod
    def _refuse_what_cannot_be_honoured(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, False, [], "none"):  # "none": the tool choice that calls nothing
            field = str(info.field_name)
            raise PydanticCustomError(
                "not_served",
                "{field} is not supported: {why}",
                {"field": field, "why": _NOT_SERVED[field]},
            )
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_within_openais_caps(cls, meta: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (meta or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("keys are at most 64 characters and values at most 512")
        return meta

    @field_validator("store")
    @classmethod
    def _nothing_is_stored(cls, store: bool | None) -> bool | None:
        if store:
            raise ValueError("llmq does not store completions; omit store or set it to false")
        return store

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, modalities: list[str] | None) -> list[str] | None:
        if modalities and any(m != "text" for m in modalities):
            raise ValueError("the models served produce text only")
        return modalities

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @model_validator(mode="after")
    def _min_tokens_within_max(self) -> ChatCompletionRequest:
        limit = self.output_limit
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> ChatCompletionRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def effective_tier(self) -> Tier:
        """llmq's `tier` when given, else OpenAI's `service_tier` mapped (`flex`: batch)."""
        if "tier" in self.model_fields_set or self.service_tier is None:
            return self.tier
        return "batch" if self.service_tier == "flex" else "interactive"

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def output_limit(self) -> int | None:
        """`max_completion_tokens` (the current name) wins over the legacy `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    """One candidate token at a position, as OpenAI's `top_logprobs` entries."""

    model_config = ConfigDict(frozen=True)

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionTokenLogprob(TopLogprob):
    """A generated token with its log probability and the most likely alternatives."""

    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    content: list[ChatCompletionTokenLogprob] | None = None
    refusal: list[ChatCompletionTokenLogprob] | None = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class Choice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    service_tier: ServiceTier | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    service_tier: ServiceTier | None = None
