"""The OpenAI chat completions surface, with OpenAI's names and fields.

Shapes follow the openai SDK's ``types/chat``; ``tier`` is llmq's one extension.
Unknown fields are rejected (as OpenAI does) so a typo never silently changes behaviour.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Tier = Literal["interactive", "batch"]
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
    user: str | None = None
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
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024)
    """Token id (as a string, OpenAI's form) -> bias from -100 (ban) to 100 (force)."""
    tier: Tier = "interactive"

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError("llmq supports only n=1")
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


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class Choice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
