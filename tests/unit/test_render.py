"""Chat rendering: OpenAI messages -> the dicts a chat template sees -> token ids."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.chat import ChatCompletionRequest
from schemas.render import (
    ChatRenderer,
    PromptTooLong,
    RenderLimits,
    longest_token_chars,
    template_messages,
)


class RecordingTokenizer:
    """Renders `role: content` lines and encodes each character as its code point."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.kwargs: dict[str, Any] = {}

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        self.seen = conversation
        self.kwargs = kwargs
        return "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + "assistant:"

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return [ord(c) for c in text]


def _messages(*raw: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": list(raw)})


def test_roles_and_content_parts_are_flattened() -> None:
    req = _messages(
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c"},
    )
    out = template_messages(req.messages)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool"]
    assert out[1]["content"] == "ab"
    assert out[2]["content"] == "" and out[2]["tool_calls"][0]["function"]["name"] == "f"
    assert out[3]["tool_call_id"] == "c"


def test_render_uses_the_models_template_with_a_generation_prompt() -> None:
    tok = RecordingTokenizer()
    renderer = ChatRenderer({"m": tok})
    ids = renderer.render("m", _messages({"role": "user", "content": "hi"}).messages)
    assert "".join(chr(i) for i in ids) == "user: hi\nassistant:"
    assert tok.kwargs == {"tools": None, "tokenize": False, "add_generation_prompt": True}


class NeverTokenizes(RecordingTokenizer):
    def encode(self, text: str, **kwargs: Any) -> list[int]:
        raise AssertionError("a prompt that cannot fit was tokenized")

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "abcd": 1, "<|im_start|>": 2}


def test_prompts_that_cannot_fit_are_refused_before_tokenizing() -> None:
    tok = NeverTokenizes()
    limits = RenderLimits(max_prompt_tokens=10, max_token_chars=longest_token_chars(tok))
    assert limits.max_chars == 120  # the longest entry, the special token, has 12 characters
    renderer = ChatRenderer({"m": tok}, {"m": limits})
    too_many = [{"role": "user", "content": "a"}] * 11
    with pytest.raises(PromptTooLong, match="11 messages"):
        renderer.render("m", _messages(*too_many).messages)
    with pytest.raises(PromptTooLong, match="121 characters"):
        renderer.render("m", _messages({"role": "user", "content": "x" * 121}).messages)
    tool_args = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "y" * 120}}
        ],
    }
    with pytest.raises(PromptTooLong):
        renderer.render("m", _messages(tool_args).messages)


def test_prompts_within_the_bound_are_tokenized() -> None:
    tok = RecordingTokenizer()
    renderer = ChatRenderer({"m": tok}, {"m": RenderLimits(10, 12)})
    ids = renderer.render("m", _messages({"role": "user", "content": "x" * 120}).messages)
    assert len(ids) > 120  # this tokenizer's tokens are single characters: it was tokenized
