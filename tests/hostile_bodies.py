"""The bodies a hostile (or careless) client can send a gateway at its limits.

Shared by the integration test that measures what they do to running streams and the e2e test
that measures what they leave in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.limits import default_max_request_bytes
from schemas.render import longest_token_chars


def body_of_size(model: str, size: int, messages: int = 1) -> bytes:
    """A chat request of exactly `size` bytes: `messages` user messages padded with text."""
    base: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": ""} for _ in range(messages)],
        "max_tokens": 1,
    }
    pad = size - len(json.dumps(base).encode())
    for i, message in enumerate(base["messages"]):
        message["content"] = "a" * (pad // messages + (pad % messages if i == 0 else 0))
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


def longest_tokenized_body(model: str, model_path: Path, max_model_len: int) -> bytes:
    """The most tokenizer work a body can ask for: CJK text just within the characters that
    could fit the context (so it is tokenized, then refused), as JSON escapes."""
    from transformers import AutoTokenizer

    chars = max_model_len * longest_token_chars(AutoTokenizer.from_pretrained(str(model_path)))
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "中" * chars}]})
    assert len(body) <= default_max_request_bytes([max_model_len])
    return body.encode()


def hostile_bodies(model: str, model_path: Path, max_model_len: int) -> list[tuple[bytes, int]]:
    """(body, the status it must get) for a gateway whose largest context is `max_model_len`."""
    limit = default_max_request_bytes([max_model_len])
    return [
        (longest_tokenized_body(model, model_path, max_model_len), 400),  # tokenized, refused
        (body_of_size(model, limit), 400),  # one long message: refused before tokenizing
        (body_of_size(model, limit, messages=max_model_len), 400),  # thousands of messages
        (body_of_size(model, limit + 1), 413),  # over the limit: refused before parsing
    ]
