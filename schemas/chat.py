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

from schemas.generation import (
    MAX_CHOICES,
    FinishReason,
    GenerationRequest,
    JSONSchema,
    ResponseFormat,
    ServiceTier,
    StreamOptions,
    Strict,
    Tier,
)

__all__ = [
    "MAX_CHOICES",
    "FinishReason",
    "JSONSchema",
    "ResponseFormat",
    "ServiceTier",
    "StreamOptions",
    "Tier",
]

_Strict = Strict


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


class ChatCompletionRequest(GenerationRequest):
    """`POST /v1/chat/completions` body (the shared fields are `GenerationRequest`'s)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
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
    logprobs: bool | None = None
    """Return each generated token's log probability (`choices[].logprobs.content`)."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """With `logprobs`, also the most likely alternatives at each position."""

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

    @property
    def output_limit(self) -> int | None:
        """`max_completion_tokens` (the current name) wins over the legacy `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


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
