"""Completions prompts: text with or without special tokens, fill-in-the-middle where the
tokenizer has FIM tokens, token ids checked against the vocabulary; and the legacy
log-probability shape."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.services.completions import legacy_logprobs
from schemas.chat import ChatCompletionTokenLogprob, TopLogprob
from schemas.completions import CompletionRequest
from schemas.render import BadTokenIds, ChatRenderer, NoFillInTheMiddle, PromptTooLong, RenderLimits

BOS = 1


class CharTokenizer:
    """Each character is its code point; `add_special_tokens` puts BOS (1) first."""

    def __init__(self, extra_vocab: tuple[str, ...] = ()) -> None:
        self.vocab = {chr(i): i for i in range(32, 127)} | {
            t: 200 + i for i, t in enumerate(extra_vocab)
        }

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> str:
        raise AssertionError("completions never use the chat template")

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, token_ids: Any, **kwargs: Any) -> str:
        return "".join(chr(t) for t in token_ids if t != BOS)

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def test_special_tokens_are_added_unless_asked_not_to() -> None:
    renderer = ChatRenderer({"m": CharTokenizer()})
    assert renderer.completion_prompt("m", "ab") == [BOS, ord("a"), ord("b")]
    assert renderer.completion_prompt("m", "ab", add_special_tokens=False) == [97, 98]


def test_a_suffix_uses_the_models_fill_in_the_middle_tokens() -> None:
    fim = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    renderer = ChatRenderer({"coder": CharTokenizer(fim), "plain": CharTokenizer()})
    text = renderer.fill_in_the_middle("coder", "def f(", "):\n")
    assert text == "<fim_prefix>def f(<fim_suffix>):\n<fim_middle>"
    with pytest.raises(NoFillInTheMiddle, match="fill-in-the-middle"):
        renderer.completion_prompt("plain", "def f(", suffix="):\n")


def test_token_ids_are_checked_against_the_vocabulary() -> None:
    renderer = ChatRenderer({"m": CharTokenizer()})
    vocab = renderer.vocab_size("m")
    assert renderer.completion_prompt("m", [5, vocab - 1]) == [5, vocab - 1]
    with pytest.raises(BadTokenIds):
        renderer.completion_prompt("m", [5, vocab])
    with pytest.raises(NoFillInTheMiddle):
        renderer.completion_prompt("m", [5], suffix="x")


def test_text_that_cannot_fit_is_refused_before_tokenizing() -> None:
    renderer = ChatRenderer({"m": CharTokenizer()}, {"m": RenderLimits(10, 2)})
    renderer.completion_prompt("m", "x" * 20)
    with pytest.raises(PromptTooLong):
        renderer.completion_prompt("m", "x" * 21)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("one", ["one"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_every_prompt_form_is_a_list_of_prompts(prompt: Any, expected: list[Any]) -> None:
    assert CompletionRequest(model="m", prompt=prompt).prompts == expected


def test_legacy_logprobs_have_offsets_into_the_text() -> None:
    def token(text: str, logprob: float) -> ChatCompletionTokenLogprob:
        return ChatCompletionTokenLogprob(
            token=text, logprob=logprob, top_logprobs=[TopLogprob(token=text, logprob=logprob)]
        )

    out = legacy_logprobs([token("Hel", -0.5), token("lo", -1.0)], offset=4)
    assert out.tokens == ["Hel", "lo"] and out.token_logprobs == [-0.5, -1.0]
    assert out.text_offset == [4, 7]
    assert out.top_logprobs == [{"Hel": -0.5}, {"lo": -1.0}]
