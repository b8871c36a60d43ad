"""`POST /v1/completions` through the queue on the real engine, with the OpenAI SDK's
`client.completions`: whole and streamed, echo, token-id and multiple prompts, logprobs, and
the fields it refuses."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests.e2e.conftest import Stack
from tests.e2e.test_batches import FINAL, lines_of, wait_for

pytestmark = pytest.mark.e2e

PROMPT = "def parse_args(argv):\n    "


def _complete(client: openai.OpenAI, **kwargs: Any) -> Any:
    direct = ("prompt", "max_tokens", "temperature", "n", "echo", "logprobs", "stream", "suffix")
    direct += ("stream_options", "seed", "stop", "best_of")
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in direct}
    kwargs.setdefault("prompt", PROMPT)
    return client.completions.create(model="tiny-llama", extra_body=extra or None, **kwargs)


def test_a_whole_completion_has_text_and_consistent_usage(
    client: openai.OpenAI, stack: Stack
) -> None:
    out = _complete(client, max_tokens=12, temperature=0, ignore_eos=True)
    tokenizer = AutoTokenizer.from_pretrained(str(stack.model_path))
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    (choice,) = out.choices
    assert choice.text and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_the_default_length_is_openais_16_tokens(client: openai.OpenAI) -> None:
    out = _complete(client, temperature=0, ignore_eos=True)
    assert out.usage.completion_tokens == 16


def test_streamed_text_equals_the_whole_text(client: openai.OpenAI) -> None:
    whole = _complete(client, max_tokens=10, temperature=0)
    chunks = list(
        _complete(
            client, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].text, "the first event carries generated text"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage == whole.usage
    assert all(c.object == "text_completion" for c in chunks)


def test_echo_puts_the_prompt_in_front_whole_and_streamed(client: openai.OpenAI) -> None:
    plain = _complete(client, max_tokens=6, temperature=0)
    echoed = _complete(client, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    chunks = list(_complete(client, max_tokens=6, temperature=0, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert len(chunks[0].choices[0].text) > len(PROMPT), "the prompt travels with a token"
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text


def test_a_prompt_of_token_ids_equals_its_text(client: openai.OpenAI, stack: Stack) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(stack.model_path))
    ids = tokenizer.encode(PROMPT)
    by_text = _complete(client, max_tokens=8, temperature=0)
    by_ids = _complete(client, prompt=ids, max_tokens=8, temperature=0, echo=True)
    assert by_ids.choices[0].text == tokenizer.decode(ids) + by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_several_prompts_and_choices_are_numbered_prompt_major(client: openai.OpenAI) -> None:
    prompts = [PROMPT, "class Stack:\n    "]
    singles = [_complete(client, prompt=p, max_tokens=5, temperature=0) for p in prompts]
    # top_k=1 is greedy (n > 1 needs a temperature above 0).
    out = _complete(client, prompt=prompts, n=2, max_tokens=5, temperature=1, top_k=1)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for index, choice in enumerate(out.choices):
        assert choice.text == singles[index // 2].choices[0].text
    assert out.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert out.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    streamed = list(
        _complete(client, prompt=prompts, n=2, max_tokens=5, temperature=1, top_k=1, stream=True)
    )
    texts = {
        i: "".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in range(4)
    }
    assert texts == {c.index: c.text for c in out.choices}


def test_logprobs_in_the_legacy_shape(client: openai.OpenAI) -> None:
    out = _complete(client, max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == 6
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(len(top) == 2 for top in lp.top_logprobs)
    # Greedy: each generated token is its position's most likely one.
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob == pytest.approx(max(top.values()), abs=1e-4)
        assert top.get(token) == pytest.approx(logprob, abs=1e-4)
    streamed = list(
        _complete(client, max_tokens=6, temperature=0, ignore_eos=True, logprobs=2, stream=True)
    )
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [
        o for c in streamed if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset
    ]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_structured_outputs_in_vllms_own_form(client: openai.OpenAI) -> None:
    chosen = _complete(client, max_tokens=8, structured_outputs={"choice": ["yes", "no"]})
    assert chosen.choices[0].text in ("yes", "no")
    digits = _complete(client, max_tokens=8, structured_outputs={"regex": "[0-9]{3}"})
    assert digits.choices[0].text.isdigit() and len(digits.choices[0].text) == 3


def test_truncate_prompt_tokens_keeps_the_last_tokens(client: openai.OpenAI) -> None:
    out = _complete(client, max_tokens=2, truncate_prompt_tokens=3)
    assert out.usage.prompt_tokens == 3


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"suffix": "\n    return args"}, "suffix"),  # tiny-llama has no fill-in-the-middle tokens
        ({"echo": True, "logprobs": 1}, None),
        ({"prompt": [[1, 2], [10**7]]}, "prompt"),
        ({"best_of": 3}, None),
        ({"n": 2, "temperature": 0}, "n"),  # greedy choices would all be the same
        ({"prompt": []}, "prompt"),
        ({"bogus_field": 1}, "bogus_field"),
        ({"structured_outputs": {"regex": "(["}}, None),  # refused by the engine: not retried
    ],
)
def test_what_cannot_be_served_is_refused_with_400(
    client: openai.OpenAI, fields: dict[str, Any], param: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _complete(client, max_tokens=2, **fields)
    error = caught.value.body
    assert isinstance(error, dict) and error.get("message")
    if param is not None:
        assert error.get("param") == param


def test_a_completions_batch_answers_each_line_as_a_text_completion(
    client: openai.OpenAI, stack: Stack
) -> None:
    prompts = [PROMPT, "import os\n", "x = 1\n"]
    lines = [
        {
            "custom_id": f"c-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": stack.model, "prompt": p, "max_tokens": 4, "temperature": 0},
        }
        for i, p in enumerate(prompts)
    ]
    data = b"\n".join(json.dumps(line).encode() for line in lines)
    uploaded = client.files.create(file=("cmpl.jsonl", data, "application/jsonl"), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, within=240)
    assert done.status == "completed" and done.request_counts.completed == 3
    out = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    for i, prompt in enumerate(prompts):
        body = out[f"c-{i}"]["response"]["body"]
        assert body["object"] == "text_completion"
        direct = _complete(client, prompt=prompt, max_tokens=4, temperature=0)
        assert body["choices"][0]["text"] == direct.choices[0].text
        assert body["usage"]["prompt_tokens"] == direct.usage.prompt_tokens


def test_a_batch_line_must_call_its_batchs_endpoint(client: openai.OpenAI, stack: Stack) -> None:
    line = {
        "custom_id": "wrong-url",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": stack.model, "prompt": PROMPT, "max_tokens": 2},
    }
    uploaded = client.files.create(
        file=("wrong.jsonl", json.dumps(line).encode(), "application/jsonl"), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id, lambda b: b.status in FINAL, within=60)
    assert done.status == "failed"
    assert done.errors is not None and done.errors.data[0].param == "url"
