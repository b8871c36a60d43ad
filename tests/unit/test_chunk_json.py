"""The rendered content chunk is byte for byte what pydantic writes for the same chunk."""

from __future__ import annotations

import pytest

from gateway.services.chunk_json import ContentChunkJson
from schemas.chat import ChatCompletionChunk, ChoiceDelta, ChunkChoice, ServiceTier


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        " world",
        'quote " and \\ backslash',
        "line\nbreak\ttab\r",
        "\x00\x1f\x7f",
        "héllo wörld ✓ 日本語 🙂",
        "@@llmq-content@@",
        "</script>",
        "",
    ],
)
@pytest.mark.parametrize("tier", ["default", "flex"])
def test_rendered_chunk_equals_the_models_json(text: str, tier: ServiceTier) -> None:
    fast = ContentChunkJson("chatcmpl-abc", 1_800_000_000, "my-model", tier)
    model = ChatCompletionChunk(
        id="chatcmpl-abc",
        created=1_800_000_000,
        model="my-model",
        choices=[ChunkChoice(index=0, delta=ChoiceDelta(content=text))],
        usage=None,
        service_tier=tier,
    )
    assert fast.render(text) == model.model_dump_json()
