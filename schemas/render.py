"""Chat rendering: messages -> prompt token ids, with each model's own chat template.

Shared by the gateway (interactive requests) and the batch service (batch lines), so both count
and send exactly the same tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.chat import AssistantMessage, ChatMessage, ToolCall, ToolMessage, content_text
from schemas.deployment import Deployment
from schemas.token_cache import PieceCachedEncoder


class PromptTooLong(ValueError):
    """The messages cannot fit the model's context, known without tokenizing them."""


class BadTokenIds(ValueError):
    """A prompt of token ids holds ids outside the model's vocabulary."""


class NoFillInTheMiddle(ValueError):
    """A `suffix` was given for a model whose tokenizer has no fill-in-the-middle tokens."""


FIM_TOKENS = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    (
        "<\uff5cfim\u2581begin\uff5c>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<\uff5cfim\u2581end\uff5c>",
    ),  # DeepSeek-Coder
)
"""Fill-in-the-middle tokens of known model families, in prefix-suffix-middle order."""


@dataclass(frozen=True)
class RenderLimits:
    """What bounds a prompt before it is tokenized: every message renders to at least one
    token, and no token covers more than `max_token_chars` characters, so text longer than
    ``max_prompt_tokens * max_token_chars`` characters cannot fit however it tokenizes."""

    max_prompt_tokens: int
    max_token_chars: int

    @property
    def max_chars(self) -> int:
        return self.max_prompt_tokens * self.max_token_chars


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (added and special tokens included):
    an upper bound on the text one token can stand for."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> Any: ...

    def get_vocab(self) -> Any: ...


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages as the plain dicts chat templates expect."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": content_text(message.content)}
        if isinstance(message, AssistantMessage) and message.tool_calls:
            item["tool_calls"] = [_template_call(call) for call in message.tool_calls]
        if isinstance(message, ToolMessage):
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _template_call(call: ToolCall) -> dict[str, Any]:
    """A call in the history as templates take it: arguments as an object when they parse
    (templates write them with `tojson`), as vLLM passes them."""
    item = call.model_dump()
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        return item
    if isinstance(arguments, dict):
        item["function"]["arguments"] = arguments
    return item


def _text_chars(message: ChatMessage) -> int:
    chars = len(content_text(message.content))
    if isinstance(message, AssistantMessage) and message.tool_calls:
        chars += sum(len(c.function.arguments) + len(c.function.name) for c in message.tool_calls)
    return chars


class ChatRenderer:
    """Renders a conversation to token ids with the deployment's tokenizer."""

    def __init__(
        self, tokenizers: dict[str, Tokenizer], limits: dict[str, RenderLimits] | None = None
    ) -> None:
        self._tokenizers = tokenizers
        self._limits = limits or {}
        self._encoders = {name: PieceCachedEncoder(t) for name, t in tokenizers.items()}
        self._by_path: dict[str, Tokenizer] = {}
        """Loaded tokenizers by folder: versions sharing one share it (and its memory)."""

    @classmethod
    def load(cls, deployments: list[Deployment]) -> ChatRenderer:
        renderer = cls({})
        for deployment in deployments:
            renderer.add(deployment)
        return renderer

    def has(self, ref: str) -> bool:
        return ref in self._tokenizers

    @staticmethod
    def load_tokenizer(path: str) -> Tokenizer:
        """The tokenizer in folder `path` (slow: call it off the event loop); raises if none."""
        # One prompt is tokenized on one thread: the caller's thread pool bounds how much CPU
        # tokenizing takes. Left on, Hugging Face tokenizers spreads one long prompt over every
        # core, so one hostile request slows every process on the machine.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)

    def add(self, deployment: Deployment) -> None:
        """Load the tokenizer of `deployment` (slow: call it off the event loop), under its
        `ref` (`name@version`), which is how callers name it from then on. Raises when its
        path holds no tokenizer."""
        tokenizer = self._by_path.get(deployment.path)
        if tokenizer is None:
            tokenizer = self._by_path[deployment.path] = self.load_tokenizer(deployment.path)
        limits = RenderLimits(deployment.max_model_len, longest_token_chars(tokenizer))
        encoder = PieceCachedEncoder(tokenizer)
        # Whole entries, each one assignment: a thread reading them sees old or new.
        self._limits[deployment.ref] = limits
        self._encoders[deployment.ref] = encoder
        self._tokenizers[deployment.ref] = tokenizer

    def check_fits(self, model: str, messages: list[ChatMessage]) -> int:
        """Refuse (`PromptTooLong`) what cannot fit the context, in time linear in the number
        of messages: a hostile body costs no tokenizing. Returns the messages' characters (what
        tokenizing them will cost, roughly)."""
        limits = self._limits.get(model)
        if limits is not None and len(messages) > limits.max_prompt_tokens:
            raise PromptTooLong(
                f"{len(messages)} messages cannot fit the model's context of "
                f"{limits.max_prompt_tokens} tokens."
            )
        chars = sum(_text_chars(m) for m in messages)
        if limits is not None and chars > limits.max_chars:
            raise PromptTooLong(
                f"The messages hold {chars} characters, more than can fit the model's "
                f"context of {limits.max_prompt_tokens} tokens."
            )
        return chars

    def render(self, model: str, messages: list[ChatMessage]) -> list[int]:
        """Token ids of the prompt, refused first if it cannot fit (`check_fits`)."""
        self.check_fits(model, messages)
        return self.tokenize(model, messages)

    def tokenize(
        self, model: str, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of the prompt, unchecked: slow for long prompts, so callers that run it
        off the event loop call `check_fits` first, on the loop (it is cheap). `tools` go to
        the template (templates that know tools describe them to the model)."""
        tokenizer = self._tokenizers[model]
        text = tokenizer.apply_chat_template(
            template_messages(messages), tools=tools, tokenize=False, add_generation_prompt=True
        )
        return self._encoders[model].encode(str(text))  # a system prompt is tokenized once

    def check_text_fits(self, model: str, text: str) -> None:
        """Refuse (`PromptTooLong`) a completion prompt that cannot fit, untokenized."""
        limits = self._limits.get(model)
        if limits is not None and len(text) > limits.max_chars:
            raise PromptTooLong(
                f"The prompt holds {len(text)} characters, more than can fit the model's "
                f"context of {limits.max_prompt_tokens} tokens."
            )

    def fill_in_the_middle(self, model: str, prefix: str, suffix: str) -> str:
        """The prompt text asking the model for what goes between `prefix` and `suffix`, in
        its family's fill-in-the-middle format; `NoFillInTheMiddle` if it has none."""
        vocab = self._tokenizers[model].get_vocab()
        for before_prefix, before_suffix, before_middle in FIM_TOKENS:
            if before_prefix in vocab and before_suffix in vocab and before_middle in vocab:
                return f"{before_prefix}{prefix}{before_suffix}{suffix}{before_middle}"
        raise NoFillInTheMiddle(
            f"suffix is not supported: the tokenizer of `{model}` has no fill-in-the-middle tokens."
        )

    def completion_prompt(
        self,
        model: str,
        prompt: str | list[int],
        suffix: str | None = None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """Token ids of a completions prompt: text is checked to fit (`PromptTooLong`), put in
        the fill-in-the-middle format with a `suffix` (`NoFillInTheMiddle`), and tokenized;
        token ids are checked against the vocabulary (`BadTokenIds`)."""
        if isinstance(prompt, list):
            if suffix is not None:
                raise NoFillInTheMiddle("suffix needs a text prompt.")
            vocab = self.vocab_size(model)
            if any(token >= vocab for token in prompt):
                raise BadTokenIds(f"Token ids must be below the vocabulary size ({vocab}).")
            return prompt
        if suffix is not None:
            prompt = self.fill_in_the_middle(model, prompt, suffix)
        self.check_text_fits(model, prompt)
        tokenizer = self._tokenizers[model]
        return list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))

    def decode(self, model: str, token_ids: list[int]) -> str:
        """The text of token ids (a prompt given as ids, for `echo`)."""
        return str(self._tokenizers[model].decode(token_ids))

    def vocab_size(self, model: str) -> int:
        """Token ids of `model` lie below this."""
        return len(self._tokenizers[model].get_vocab())
