"""Tool calling on the real engine through the queue, with the OpenAI SDK: a named choice and
"required" give `tool_calls` whose arguments match the function's schema (constrained
decoding), whole and streamed; the legacy `functions` give `function_call`; tool messages in
the history render; "auto" parses calls the model writes (hermes format) where the
deployment names a parser, and is refused with a clear 400 where it names none."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import STRICT_MODEL, Stack

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Paris", "Lima"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}}
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _chat(client: openai.OpenAI, stack: Stack, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 60)
    return client.chat.completions.create(model=stack.model, **kwargs)


def test_a_named_tool_choice_returns_a_call_matching_the_schema(
    client: openai.OpenAI, stack: Stack
) -> None:
    out = _chat(client, stack, tools=[WEATHER, TIME], tool_choice=NAMED)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)


def test_a_streamed_named_call_arrives_as_argument_deltas(
    client: openai.OpenAI, stack: Stack
) -> None:
    whole = _chat(client, stack, tools=[WEATHER], tool_choice=NAMED, temperature=0)
    chunks = list(
        _chat(client, stack, tools=[WEATHER], tool_choice=NAMED, temperature=0, stream=True)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and deltas[0].tool_calls, "the first event is the call"
    head = deltas[0].tool_calls[0]
    assert head.id and head.function and head.function.name == "get_weather"
    arguments = "".join(
        call.function.arguments or ""
        for d in deltas
        for call in d.tool_calls or ()
        if call.function
    )
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_required_returns_calls_of_the_offered_tools(client: openai.OpenAI, stack: Stack) -> None:
    for stream in (False, True):
        kwargs: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": "required"}
        out = _chat(client, stack, parallel_tool_calls=False, stream=stream, **kwargs)
        if stream:
            chunks = [c for c in out if c.choices]
            calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or ()]
            finish = chunks[-1].choices[0].finish_reason
        else:
            calls, finish = out.choices[0].message.tool_calls, out.choices[0].finish_reason
        assert finish == "tool_calls" and len(calls) == 1
        (call,) = calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_legacy_functions_return_a_function_call(client: openai.OpenAI, stack: Stack) -> None:
    out = _chat(
        client, stack, functions=[WEATHER["function"]], function_call={"name": "get_weather"}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.function_call
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER_PARAMETERS)


def test_a_conversation_with_tool_results_renders_and_answers(
    client: openai.OpenAI, stack: Stack
) -> None:
    first = _chat(client, stack, tools=[WEATHER], tool_choice=NAMED)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 4}'},
    ]
    answer = _chat(client, stack, messages=history, tools=[WEATHER], tool_choice="none")
    assert answer.choices[0].message.tool_calls is None
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and result count


FORCED_CALL = (
    r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Oslo", "days": 2\}\}</tool_call>'
)
"""A regex that makes the model write one call in the hermes format (vLLM's structured
outputs): the parser, not the model's skill, is what this exercises."""


def test_auto_with_a_parser_turns_written_calls_into_tool_calls(
    client: openai.OpenAI, stack: Stack
) -> None:
    extra = {"structured_outputs": {"regex": FORCED_CALL}}
    whole = _chat(client, stack, tools=[WEATHER, TIME], extra_body=extra, max_tokens=300)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}
    chunks = [
        c
        for c in _chat(
            client, stack, tools=[WEATHER], extra_body=extra, stream=True, max_tokens=300
        )
        if c.choices
    ]
    calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or ()]
    assert [c.function.name for c in calls] == ["get_weather"]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_text_answers_stream_as_content(client: openai.OpenAI, stack: Stack) -> None:
    kwargs: dict[str, Any] = {
        "temperature": 0,
        "max_tokens": 12,
        "extra_body": {"ignore_eos": True},
    }
    plain = _chat(client, stack, **kwargs).choices[0].message.content
    assert "<tool_call>" not in plain  # the model writes no call: its text is the answer
    auto = _chat(client, stack, tools=[WEATHER], **kwargs).choices[0]
    # The tiny model's template ignores tools: the same prompt, the same greedy text.
    assert auto.message.content == plain and auto.message.tool_calls is None
    assert auto.finish_reason == "length"
    streamed = _chat(client, stack, tools=[WEATHER], stream=True, **kwargs)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain


def test_auto_without_a_parser_is_refused_with_a_clear_400(client: openai.OpenAI) -> None:
    for kwargs in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=STRICT_MODEL, messages=ASK, max_tokens=4, **kwargs)
        body = caught.value.body
        assert isinstance(body, dict) and body["param"] == "tool_choice"
        assert "auto" in body["message"]
