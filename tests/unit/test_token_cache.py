"""The piece cache gives the ids a whole tokenization gives, and turns itself off when not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.token_cache import MIN_CACHED_CHARS, VERIFY_FIRST, PieceCachedEncoder


@dataclass
class Added:
    content: str
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


class WordTokenizer:
    """Ids: one per added token, one per character otherwise (so pieces concatenate);
    counts what it was asked to tokenize."""

    def __init__(self, **flags: bool) -> None:
        self.added_tokens_decoder = {0: Added("<s>", **flags), 1: Added("<sep>", **flags)}
        self.calls: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.calls.append(text)
        ids: list[int] = []
        i = 0
        while i < len(text):
            for token_id, token in self.added_tokens_decoder.items():
                if text.startswith(token.content, i):
                    ids.append(token_id)
                    i += len(token.content)
                    break
            else:
                ids.append(1000 + ord(text[i]))
                i += 1
        return ids


SYSTEM = "system\n" + "You are a careful assistant. " * 20  # longer than MIN_CACHED_CHARS


def _prompt(question: str) -> str:
    return f"<s>{SYSTEM}<sep><s>user\n{question}<sep><s>assistant\n"


def test_pieces_give_the_whole_ids_and_the_long_piece_is_tokenized_once() -> None:
    assert len(SYSTEM) >= MIN_CACHED_CHARS
    tokenizer = WordTokenizer()
    encoder = PieceCachedEncoder(tokenizer)
    assert encoder.enabled
    for n in range(VERIFY_FIRST + 10):
        assert encoder.encode(_prompt(f"question {n}?")) == tokenizer.encode(
            _prompt(f"question {n}?")
        )
    system_pieces = [c for c in tokenizer.calls if c == SYSTEM]
    assert len(system_pieces) == 1  # cached after its first use (whole prompts aside)


def test_tokens_that_take_whitespace_turn_the_cache_off() -> None:
    assert not PieceCachedEncoder(WordTokenizer(rstrip=True)).enabled
    assert not PieceCachedEncoder(WordTokenizer(normalized=True)).enabled
    assert not PieceCachedEncoder(object()).enabled  # no added tokens known: whole prompts


def test_a_difference_from_the_whole_turns_the_cache_off_for_good() -> None:
    class Merging(WordTokenizer):
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            ids = super().encode(text, add_special_tokens)
            return [7] if "<sep>" in text and len(text) > 300 else ids  # merges across tokens

    tokenizer: Any = Merging()
    encoder = PieceCachedEncoder(tokenizer)
    whole = encoder.encode(_prompt("q"))
    assert whole == [7] and not encoder.enabled
    assert encoder.encode(_prompt("q")) == [7]
