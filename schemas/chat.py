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
    PrivateAttr,
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
from schemas.tools import (
    MAX_TOOLS,
    FunctionCallChoice,
    FunctionDefinition,
    FunctionTool,
    ToolChoice,
    ToolPlan,
    ToolsError,
    tool_plan,
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


class TextContentPart(Strict):
    type: Literal["text"]
    text: str


MessageContent = str | list[TextContentPart]


class SystemMessage(Strict):
    role: Literal["system", "developer"]
    content: MessageContent
    name: str | None = None


class UserMessage(Strict):
    role: Literal["user"]
    content: MessageContent
    name: str | None = None


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: MessageContent | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ToolMessage(Strict):
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
    "audio": "the models served produce text only",
    "web_search_options": "llmq runs no web search",
    "moderation": "llmq runs no moderation",
}
"""OpenAI fields accepted by name but refused when set, with the reason."""


class ChatCompletionRequest(GenerationRequest):
    """`POST /v1/chat/completions` body (the shared fields are `GenerationRequest`'s)."""

    _tool_plan: ToolPlan | None = PrivateAttr(default=None)

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    store: bool | None = None
    """Accepted; llmq stores no completions, so `true` is refused."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """Accepted; no effect on the models served (none of them reasons)."""
    modalities: list[Literal["text", "audio"]] | None = None
    """Only text can be produced: `["text"]` is accepted, audio is refused."""
    parallel_tool_calls: bool | None = None
    """With tool_choice "required": false allows exactly one call."""
    verbosity: Literal["low", "medium", "high"] | None = None
    """Accepted; no effect (the models served take no verbosity control)."""
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    """Accepted; no effect: cached prefixes live in the engine's KV memory until evicted."""
    prompt_cache_options: dict[str, Any] | None = None
    """Accepted; no effect (cache breakpoints and lifetimes are the engine's own)."""
    prediction: dict[str, Any] | None = None
    """Accepted; no effect: a predicted output only speeds OpenAI's models up, the answer is
    the same."""
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    """A named function or "required": the output is the call (constrained to the schema);
    "none": text; "auto" (the default with tools): text or calls, where the deployment names a
    tool-call parser (else 400), see `schemas.tools`."""
    functions: list[FunctionDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    """Legacy form of `tools`."""
    function_call: FunctionCallChoice | None = None
    """Legacy form of `tool_choice`; answered as `message.function_call`."""
    # OpenAI fields llmq cannot honour: named here so they get a clear 400, not an
    # "unrecognized argument".
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
    def _tools_are_consistent(self) -> ChatCompletionRequest:
        try:
            plan = tool_plan(
                self.tools,
                self.tool_choice,
                self.functions,
                self.function_call,
                self.parallel_tool_calls,
            )
        except ToolsError as exc:  # the param rides in the context: the gateway names it
            raise PydanticCustomError(
                "invalid_tools", "{why}", {"why": str(exc), "param": exc.param}
            ) from exc
        constrained = self.structured_outputs is not None or (
            self.response_format is not None and self.response_format.type != "text"
        )
        if plan is not None and plan.mode != "auto" and constrained:
            raise ValueError("a tool choice cannot be combined with a JSON response format")
        self._tool_plan = plan
        return self

    @property
    def tool_plan(self) -> ToolPlan | None:
        """How the output becomes tool calls (None: it is text)."""
        return self._tool_plan

    @property
    def tool_schema(self) -> dict[str, Any] | None:
        return None if self._tool_plan is None else self._tool_plan.schema()

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (legacy functions as tools)."""
        defined = [t.function for t in self.tools or ()] or list(self.functions or ())
        if not defined:
            return None
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in defined]

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
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None
    """Legacy: the call of a request that used `functions`."""


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


class ChoiceDeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ChoiceDeltaToolCall(BaseModel):
    """Part of a streamed tool call: the first part names it, later ones add arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChoiceDeltaFunction | None = None


class ChoiceDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None
    function_call: ChoiceDeltaFunction | None = None


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
