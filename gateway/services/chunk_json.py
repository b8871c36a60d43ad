"""The JSON of a stream's common chunk, rendered from a template instead of a model.

Most chunks of a chat stream are one choice's next piece of text and nothing else. Building a
`ChatCompletionChunk` and serialising it for each was a large share of the gateway's cost per
token; the template is made once per request, by pydantic itself, so the bytes are exactly
what the model would write (a unit test holds the two equal).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring

from schemas.chat import ChatCompletionChunk, ChoiceDelta, ChunkChoice, ServiceTier

_MARK = "@@llmq-content@@"


class ContentChunkJson:
    """`chat.completion.chunk` JSON for a content delta of choice 0 (no role, no logprobs)."""

    def __init__(
        self,
        request_id: str,
        created: int,
        model: str,
        service_tier: ServiceTier,
        system_fingerprint: str | None = None,
    ):
        template = ChatCompletionChunk(
            id=request_id,
            created=created,
            model=model,
            choices=[ChunkChoice(index=0, delta=ChoiceDelta(content=_MARK))],
            usage=None,
            service_tier=service_tier,
            system_fingerprint=system_fingerprint,
        ).model_dump_json()
        self._head, self._tail = template.split(json.dumps(_MARK), 1)

    def render(self, text: str) -> str:
        # `json.dumps(text, ensure_ascii=False)` without building an encoder per call: UTF-8
        # as it is, and the same escapes as pydantic's encoder.
        return self._head + encode_basestring(text) + self._tail
