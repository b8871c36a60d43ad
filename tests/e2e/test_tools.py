"""Tool calling on the real engine through the queue, with the OpenAI SDK: a named choice and
"required" give `tool_calls` whose arguments match the function's schema (constrained
decoding), whole and streamed; the legacy `functions` give `function_call`; tool messages in
the history render; "auto" is refused with a clear 400."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Stack

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
    return client.chat.completions.create(model=stack.model, max_tokens=60, **kwargs)


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


def test_auto_is_refused_with_a_clear_400(client: openai.OpenAI, stack: Stack) -> None:
    for kwargs in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}):
        with pytest.raises(openai.BadRequestError) as caught:
            _chat(client, stack, **kwargs)
        body = caught.value.body
        assert isinstance(body, dict) and body["param"] == "tool_choice"
        assert "auto" in body["message"]
