"""The legacy completions surface (`POST /v1/completions`), with OpenAI's names and fields.

Shapes follow the openai SDK's ``types/completion*.py``; the shared sampling fields are
`GenerationRequest`'s. Code-completion plug-ins and most benchmark tools speak this API.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from schemas.chat import CompletionUsage
from schemas.generation import FinishReason, GenerationRequest, ServiceTier

MAX_PROMPTS = 16
"""Most prompts one request may carry; each runs as its own job."""
DEFAULT_MAX_TOKENS = 16
"""OpenAI's (and vLLM's) default `max_tokens` for completions."""

TokenIds = list[Annotated[int, Field(ge=0)]]
Prompt = str | list[str] | TokenIds | list[TokenIds]


class CompletionRequest(GenerationRequest):
    """`POST /v1/completions` body."""

    prompt: Prompt
    """A string, a list of strings, a list of token ids, or a list of such lists."""
    max_tokens: int | None = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    echo: bool | None = False
    """Put the prompt in front of the generated text (in a stream: with the first token)."""
    logprobs: int | None = Field(default=None, ge=0, le=20)
    """Each generated token's log probability, with this many most likely alternatives."""
    suffix: str | None = None
    """Text after the completion (fill-in-the-middle): served only for models whose tokenizer
    has fill-in-the-middle tokens; refused with 400 otherwise."""
    best_of: int | None = Field(default=None, ge=1)
    """Accepted when equal to `n` (or 1): llmq, like vLLM's V1 engine, returns every choice it
    generates rather than ranking extra ones."""
    add_special_tokens: bool = True
    """vLLM's extension: add the tokenizer's special tokens (such as BOS) to a text prompt."""

    @field_validator("prompt")
    @classmethod
    def _bounded_prompts(cls, prompt: Prompt) -> Prompt:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(prompt[0], (str, list)) and len(prompt) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
            if any(isinstance(p, list) and not p for p in prompt):
                raise ValueError("a prompt of token ids must not be empty")
        return prompt

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of not in (1, self.choices):
            raise ValueError("best_of must equal n: llmq returns every choice it generates")
        return self

    @model_validator(mode="after")
    def _echo_without_prompt_logprobs(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs (the prompt's log probabilities) is not supported yet"
            )
        return self

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """Each prompt, as text or as token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [[int(t) for t in prompt if isinstance(t, int)]]
        if all(isinstance(p, str) for p in prompt):
            return [p for p in prompt if isinstance(p, str)]
        return [[int(t) for t in p] for p in prompt if isinstance(p, list)]

    @property
    def logprobs_count(self) -> int | None:
        return self.logprobs


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy log-probability shape, one entry per token of the choice's text."""

    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    """None only on a streamed chunk before the choice's end."""
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """A whole `text_completion`, or one streamed chunk of it (the same object)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    service_tier: ServiceTier | None = None
