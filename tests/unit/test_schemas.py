"""The OpenAI request surface and the internal messages: what is accepted, what is refused."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.chat import ChatCompletionRequest
from schemas.messages import InferenceJob, SamplingSettings, TokenEvent, reply_event_adapter

BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _req(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**BASE, **extra})


def test_minimal_request_defaults() -> None:
    req = _req()
    assert req.stream is False
    assert req.tier == "interactive"
    assert req.output_limit is None
    assert req.stop_list == []


@pytest.mark.parametrize(
    "extra",
    [
        {"stream": True, "stream_options": {"include_usage": True}},
        {"max_tokens": 5},
        {"max_completion_tokens": 7, "max_tokens": 5},
        {"temperature": 0, "top_p": 0.5, "seed": 3, "stop": ["a", "b"], "user": "u"},
        {"response_format": {"type": "json_object"}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            }
        },
        {"tier": "batch", "n": 1},
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "developer", "content": "d"},
                {"role": "user", "content": [{"type": "text", "text": "u"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "content": "r", "tool_call_id": "c1"},
            ]
        },
    ],
)
def test_valid_requests(extra: dict[str, Any]) -> None:
    _req(**extra)


def test_max_completion_tokens_wins() -> None:
    assert _req(max_completion_tokens=7, max_tokens=5).output_limit == 7


def test_json_schema_keeps_its_schema() -> None:
    req = _req(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"a": 1}}}
    )
    assert req.response_format is not None and req.response_format.type == "json_schema"
    assert req.response_format.json_schema.schema_ == {"a": 1}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"n": 5}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"tier": "platinum"}, "tier"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"stream_options": {"include_usage": True}}, None),
        ({"frobnicate": True}, "frobnicate"),
    ],
)
def test_invalid_requests(extra: dict[str, Any], field: str | None) -> None:
    with pytest.raises(ValidationError) as info:
        _req(**extra)
    if field is not None:
        assert info.value.errors()[0]["loc"][0] == field


def _job(**extra: Any) -> dict[str, Any]:
    return {
        "request_id": "r1",
        "team": "t",
        "model": "m",
        "pool": "p",
        "prompt_token_ids": [1, 2, 3],
        "sampling": {"max_tokens": 4},
        "created_at": 1.0,
        "deadline": 2.0,
        "reply_to": "llmq:reply:g",
        **extra,
    }


def test_job_round_trips_as_json() -> None:
    job = InferenceJob.model_validate(_job())
    again = InferenceJob.model_validate_json(job.to_bytes())
    assert again == job
    assert again.schema_version == 1
    assert again.sampling == SamplingSettings(max_tokens=4)


@pytest.mark.parametrize(
    "extra", [{"schema_version": 2}, {"surprise": 1}, {"type": "other"}, {"tier": "gold"}]
)
def test_job_is_strict(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        InferenceJob.model_validate(_job(**extra))


def test_job_is_frozen() -> None:
    job = InferenceJob.model_validate(_job())
    with pytest.raises(ValidationError):
        job.team = "other"  # type: ignore[misc]


def test_reply_events_are_discriminated_by_type() -> None:
    raw = TokenEvent(request_id="r", seq=0, text="a", num_tokens=1).to_bytes()
    assert isinstance(reply_event_adapter.validate_json(raw), TokenEvent)
    with pytest.raises(ValidationError):
        reply_event_adapter.validate_json(b'{"type": "nope", "request_id": "r"}')


def test_vllm_sampling_extensions_reach_the_job() -> None:
    from schemas.messages import sampling_settings

    req = _req(
        top_k=5, min_p=0.1, repetition_penalty=1.2, min_tokens=3, ignore_eos=True,
        stop_token_ids=[7, 9], include_stop_str_in_output=True, skip_special_tokens=False,
        spaces_between_special_tokens=False, logit_bias={"42": -100, "7": 5.5}, max_tokens=8,
    )  # fmt: skip
    s = sampling_settings(req, 8)
    assert (s.top_k, s.min_p, s.repetition_penalty, s.min_tokens) == (5, 0.1, 1.2, 3)
    assert s.ignore_eos and s.include_stop_str_in_output and s.stop_token_ids == (7, 9)
    assert not s.skip_special_tokens and not s.spaces_between_special_tokens
    assert s.logit_bias == {42: -100, 7: 5.5}
    defaults = sampling_settings(_req(top_k=-1), 8)  # vLLM's "no cut" spelling
    assert (defaults.top_k, defaults.repetition_penalty, defaults.logit_bias) == (0, 1.0, None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logit_bias": {"hello": 1}}, "token ids"),
        ({"logit_bias": {"5": 101}}, "[-100, 100]"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"top_k": -2}, "greater than or equal to -1"),
        ({"repetition_penalty": 0}, "greater than 0"),
    ],
)
def test_vllm_sampling_extensions_are_validated(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        _req(**extra)


@pytest.mark.parametrize(
    ("extra", "tier"),
    [
        ({}, "interactive"),
        ({"service_tier": "flex"}, "batch"),
        ({"service_tier": "priority"}, "interactive"),
        ({"service_tier": "auto"}, "interactive"),
        ({"service_tier": "flex", "tier": "interactive"}, "interactive"),  # llmq's own wins
    ],
)
def test_service_tier_maps_to_llmqs_tiers(extra: dict[str, Any], tier: str) -> None:
    assert _req(**extra).effective_tier == tier


def test_openai_fields_with_no_effect_are_accepted() -> None:
    req = _req(
        store=False, reasoning_effort="low", modalities=["text"], parallel_tool_calls=True,
        metadata={"k": "v" * 512}, user="u-1", safety_identifier="s-1", prompt_cache_key="faq",
    )  # fmt: skip
    assert req.metadata == {"k": "v" * 512} and req.prompt_cache_key == "faq"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": True}, "store"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"service_tier": "cheap"}, "service_tier"),
    ],
)
def test_values_that_cannot_be_honoured_are_refused(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as info:
        _req(**extra)
    assert info.value.errors()[0]["loc"][0] == param


def test_newer_openai_fields_without_effect_are_accepted() -> None:
    req = _req(
        verbosity="low", prompt_cache_retention="24h", prompt_cache_options={"ttl": "1h"},
        prediction={"type": "content", "content": "x"}, logprobs=False, tool_choice="none",
    )  # fmt: skip
    assert req.verbosity == "low"


@pytest.mark.parametrize(
    ("extra", "param", "why"),
    [
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio", "text only"),
        ({"web_search_options": {}}, "web_search_options", "web search"),
        ({"moderation": {"model": "m"}}, "moderation", "moderation"),
    ],
)
def test_openai_fields_not_served_get_a_clear_refusal(
    extra: dict[str, Any], param: str, why: str
) -> None:
    with pytest.raises(ValidationError) as info:
        _req(**extra)
    error = info.value.errors()[0]
    assert error["loc"] == (param,) and error["type"] == "not_served" and why in error["msg"]


def test_logprobs_map_to_the_number_of_alternatives() -> None:
    from schemas.messages import sampling_settings

    assert sampling_settings(_req(), 4).logprobs is None
    assert sampling_settings(_req(logprobs=True), 4).logprobs == 0
    assert sampling_settings(_req(logprobs=True, top_logprobs=3), 4).logprobs == 3
    with pytest.raises(ValidationError, match="top_logprobs needs logprobs"):
        _req(top_logprobs=2)
    with pytest.raises(ValidationError):
        _req(logprobs=True, top_logprobs=21)
