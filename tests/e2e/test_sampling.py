"""vLLM's sampling extensions through the queue, with the OpenAI SDK's `extra_body`, on the real
engine: each changes the output the way vLLM's own server would."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "Tell me about the sea."}]


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    direct = ("max_tokens", "temperature", "n", "seed", "stop", "frequency_penalty")
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in direct}
    return client.chat.completions.create(
        model="tiny-llama", messages=ASK, extra_body=extra, **kwargs
    )


def test_top_k_1_is_greedy(client: openai.OpenAI) -> None:
    greedy = _chat(client, max_tokens=24, temperature=0)
    for seed in (1, 2):
        sampled = _chat(client, max_tokens=24, temperature=1.0, top_k=1, seed=seed)
        assert sampled.choices[0].message.content == greedy.choices[0].message.content


def test_min_tokens_and_ignore_eos_reach_the_length_asked_for(client: openai.OpenAI) -> None:
    for out in (
        _chat(client, max_tokens=40, min_tokens=40, seed=3),
        _chat(client, max_tokens=40, ignore_eos=True, seed=4),
    ):
        assert out.usage.completion_tokens == 40
        assert out.choices[0].finish_reason == "length"


def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI, stack: Stack) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(stack.model_path))
    first = _chat(client, max_tokens=1, temperature=0).choices[0].message.content
    (banned,) = tokenizer.encode(first, add_special_tokens=False)  # the greedy first token
    unbiased = _chat(client, max_tokens=1, temperature=0, logit_bias={str(banned): -100})
    assert unbiased.choices[0].message.content != first
    forced_id = tokenizer.encode(" sea", add_special_tokens=False)[-1]
    forced = _chat(client, max_tokens=3, temperature=0, logit_bias={str(forced_id): 100})
    assert forced.choices[0].message.content == tokenizer.decode([forced_id] * 3)


def test_a_stop_token_id_ends_the_answer(client: openai.OpenAI, stack: Stack) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(stack.model_path))
    whole = _chat(client, max_tokens=12, temperature=0, ignore_eos=True)
    ids = tokenizer.encode(whole.choices[0].message.content, add_special_tokens=False)
    stopped = _chat(client, max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[ids[3]])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 12


def test_a_seed_repeats_a_sampled_answer(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"max_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    first, again = (_chat(client, seed=11, **kwargs) for _ in range(2))
    assert first.choices[0].message.content == again.choices[0].message.content
    others = {_chat(client, seed=s, **kwargs).choices[0].message.content for s in (12, 13)}
    assert others != {first.choices[0].message.content}


def test_stop_strings_end_the_answer_with_or_without_the_stop(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"max_tokens": 24, "temperature": 0, "ignore_eos": True}
    whole = _chat(client, **kwargs).choices[0].message.content
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    cut = _chat(client, stop=[stop], **kwargs).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == whole[: whole.index(stop)]
    kept = _chat(client, stop=[stop], include_stop_str_in_output=True, **kwargs).choices[0]
    assert kept.message.content == whole[: whole.index(stop) + len(stop)]


def test_min_p_1_is_greedy_and_penalties_change_a_greedy_answer(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"max_tokens": 32, "ignore_eos": True}
    greedy = _chat(client, temperature=0, **kwargs).choices[0].message.content
    only_the_likeliest = _chat(client, temperature=1.0, min_p=1.0, seed=7, **kwargs)
    assert only_the_likeliest.choices[0].message.content == greedy
    for penalty in ({"repetition_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised = _chat(client, temperature=0, **penalty, **kwargs)
        assert penalised.choices[0].message.content != greedy, penalty


def test_unknown_fields_are_still_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, max_tokens=1, colour="blue")
    assert info.value.body["param"] == "colour"  # type: ignore[index]


def test_logprobs_come_with_every_token_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    whole = _chat(client, logprobs=True, top_logprobs=3, **kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        # greedy: the chosen token is the most likely one
        assert token.top_logprobs[0].token == token.token
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=ASK,
        stream=True,
        logprobs=True,
        top_logprobs=2,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    streamed = [
        token
        for chunk in stream
        if chunk.choices and chunk.choices[0].logprobs
        for token in chunk.choices[0].logprobs.content or []
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert _chat(client, **kwargs).choices[0].logprobs is None  # only when asked


def test_n_choices_whole_and_streamed_each_billed(client: openai.OpenAI) -> None:
    whole = _chat(client, max_tokens=5, ignore_eos=True, n=3, seed=5)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason == "length" for c in whole.choices)
    assert whole.usage.completion_tokens == 15  # five tokens for each of three choices
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=ASK,
        stream=True,
        n=2,
        max_tokens=5,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert set(text) == {0, 1} and all(text.values())
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
