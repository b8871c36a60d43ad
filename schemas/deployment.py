"""A served model and its pool: configuration shared by the gateway and the batch service."""

from __future__ import annotations

from pydantic import BaseModel


class Deployment(BaseModel):
    """A model the gateway serves and the pool of workers that runs it."""

    name: str
    """The model name callers use (`model` in requests)."""
    path: str
    """A folder with the model's tokenizer and chat template (the weights may live elsewhere)."""
    pool: str
    """The worker pool whose job topics carry this model's requests."""
    max_model_len: int = 2048
    """Prompt plus output tokens the engine accepts for one request."""
    ttft_slo_s: float = 1.0
    """Interactive requests whose predicted time to first token exceeds this get 429."""
