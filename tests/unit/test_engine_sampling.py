"""Every sampling field a request can set reaches vLLM's `SamplingParams` (no engine needed:
the adapter only builds them)."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.messages import sampling_settings
from workers.engine.vllm_engine import VllmEngine

pytest.importorskip("vllm")


def _params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int = 20) -> Any:
    engine = VllmEngine("unused", "m", max_num_seqs=1, max_model_len=64)
    return engine._sampling_params(sampling_settings(request, max_tokens))


def test_every_sampling_field_is_passed_to_vllm() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.5, "presence_penalty": -0.5,
            "stop": ["x"], "seed": 3, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
            "min_tokens": 2, "ignore_eos": True, "stop_token_ids": [7],
            "include_stop_str_in_output": True, "skip_special_tokens": False,
            "spaces_between_special_tokens": False, "logit_bias": {"9": -100},
            "logprobs": True, "top_logprobs": 2, "n": 2,
        }
    )  # fmt: skip
    p = _params(request)
    assert (p.temperature, p.top_p, p.seed, p.n, p.max_tokens) == (0.7, 0.9, 3, 2, 20)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.top_k, p.min_p, p.min_tokens, p.ignore_eos) == (5, 0.1, 2, True)
    assert p.stop == ["x"] and p.stop_token_ids == [7] and p.include_stop_str_in_output
    assert not p.skip_special_tokens and not p.spaces_between_special_tokens
    assert p.logit_bias == {9: -100} and p.logprobs == 2


@pytest.mark.parametrize(
    ("structured", "attribute", "value"),
    [
        ({"regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"choice": ["a", "b"]}, "choice", ["a", "b"]),
        ({"grammar": 'root ::= "x"'}, "grammar", 'root ::= "x"'),
        ({"json": '{"type": "object"}'}, "json", {"type": "object"}),
        ({"json_object": True}, "json_object", True),
    ],
)
def test_structured_outputs_reach_vllm(
    structured: dict[str, Any], attribute: str, value: Any
) -> None:
    request = CompletionRequest(model="m", prompt="p", structured_outputs=structured)  # type: ignore[arg-type]
    assert getattr(_params(request).structured_outputs, attribute) == value


def test_a_tool_choice_constrains_to_its_schema() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        }
    )  # fmt: skip
    assert _params(request).structured_outputs.json == schema
