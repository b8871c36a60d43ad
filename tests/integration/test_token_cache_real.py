"""The piece cache on the real tokenizer of the local model: the same ids as tokenizing each
rendered prompt whole, over conversations that share system prompts and ones that do not."""

from __future__ import annotations

import random

import pytest

from llmq.modelbuild import ensure_model
from schemas.token_cache import PieceCachedEncoder

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"


def test_cached_pieces_match_whole_tokenization_on_the_real_tokenizer() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_model(MODEL)))
    encoder = PieceCachedEncoder(tokenizer)
    assert encoder.enabled
    rng = random.Random(7)
    systems = [
        f"You are help desk {i}. " + "Answer politely, briefly and in the customer's language. " * 8
        for i in range(3)
    ]
    words = ["refund", "  spaced", "naïve", "日本語", "\n\nnew para", "<|im_end", "tab\t", "🙂"]
    for n in range(200):
        messages = [
            {"role": "system", "content": rng.choice(systems)},
            {"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(1, 12)))},
        ]
        if n % 3 == 0:
            messages.append({"role": "assistant", "content": rng.choice(words)})
            messages.append({"role": "user", "content": f"and {n}?"})
        text = str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
        assert encoder.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))
    assert encoder.enabled  # never had to turn itself off
