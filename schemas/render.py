"""Chat rendering: messages -> prompt token ids, with each model's own chat template.

Shared by the gateway (interactive requests) and the batch service (batch lines), so both count
and send exactly the same tokens.
"""

from __future__ import annotations

from typing import Any, Protocol

from schemas.chat import AssistantMessage, ChatMessage, ToolMessage, content_text
from schemas.deployment import Deployment


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages as the plain dicts chat templates expect."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": content_text(message.content)}
        if isinstance(message, AssistantMessage) and message.tool_calls:
            item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if isinstance(message, ToolMessage):
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


class ChatRenderer:
    """Renders a conversation to token ids with the deployment's tokenizer."""

    def __init__(self, tokenizers: dict[str, Tokenizer]) -> None:
        self._tokenizers = tokenizers

    @classmethod
    def load(cls, deployments: list[Deployment]) -> ChatRenderer:
        from transformers import AutoTokenizer

        return cls({d.name: AutoTokenizer.from_pretrained(d.path) for d in deployments})

    def render(self, model: str, messages: list[ChatMessage]) -> list[int]:
        tokenizer = self._tokenizers[model]
        text = tokenizer.apply_chat_template(
            template_messages(messages), tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer.encode(str(text), add_special_tokens=False))
