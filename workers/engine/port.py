"""The engine port: what the pull loop needs from an inference engine.

Modelled on vLLM's ``EngineClient`` protocol, reduced to what a queue worker uses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from schemas.chat import ChatCompletionTokenLogprob
from schemas.messages import InferenceJob


class EngineRequestError(ValueError):
    """The engine refused the request itself (a grammar it cannot compile, a value it does
    not accept): every run would fail the same way, so it is answered, not retried."""

    code = "invalid_request"
    """The error code the caller gets."""


class AdapterLoadError(EngineRequestError):
    """The job's LoRA adapter could not be fetched, verified or loaded: that adapter's
    requests fail (and the gateway marks it failed); the base and other adapters serve on."""

    code = "adapter_load_failed"


@dataclass(frozen=True)
class EngineStep:
    """What one engine step produced for one request (a delta, not the cumulative output)."""

    text: str
    num_new_tokens: int
    prompt_tokens: int
    cached_tokens: int
    finished: bool
    finish_reason: str | None = None
    logprobs: tuple[ChatCompletionTokenLogprob, ...] | None = None
    """The step's tokens with their log probabilities, when the job asked for them."""
    index: int = 0
    """The choice these tokens belong to (jobs with `n` > 1); `finish_reason` is that
    choice's, set on the step that ends it; `finished` says the whole job ended."""


@dataclass(frozen=True)
class EngineStats:
    """The engine's load, as of its last scheduler step."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens (cached ones included) absorbed per second of engine steps that
    finished prefills; 0 until measured."""
    adapters: tuple[str, ...] = ()
    """The LoRA adapters (`team/name`) the engine has loaded."""


class EngineClient(Protocol):
    """An engine that runs jobs concurrently and streams their deltas."""

    max_num_seqs: int
    max_model_len: int
    kv_capacity_tokens: int
    """Tokens the KV cache holds in all (0 until started, or when unknown)."""

    async def start(self) -> None:
        """Load the model; return when the engine can take requests."""

    def generate(self, job: InferenceJob) -> AsyncIterator[EngineStep]:
        """Run one job; yield one `EngineStep` per engine step until it is finished."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running request and free its KV blocks."""

    def stats(self) -> EngineStats:
        """Current load, from the engine's own scheduler statistics."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and its processes."""
