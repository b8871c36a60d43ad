"""Tool calling's logic: which plan a request's tool fields make, the schema that constrains
the output, and how a choice's output becomes OpenAI tool calls, whole and streamed."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.services.tool_calls import ToolCallAnswer
from schemas.chat import ChatCompletionRequest
from schemas.messages import sampling_settings
from schemas.tool_parsers import HermesToolParser
from schemas.tools import ToolPlan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def _req(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    )


def test_a_named_choice_constrains_the_output_to_the_functions_parameters() -> None:
    req = _req(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert req.tool_plan is not None and req.tool_plan.mode == "named"
    assert sampling_settings(req, 10).json_schema == WEATHER["function"]["parameters"]


def test_required_constrains_the_output_to_an_array_of_calls() -> None:
    schema = _req(tools=[WEATHER, TIME], tool_choice="required").tool_schema
    assert schema is not None and schema["type"] == "array" and schema["minItems"] == 1
    assert "maxItems" not in schema
    names = [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    single = _req(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert single.tool_schema is not None and single.tool_schema["maxItems"] == 1


def test_none_or_no_tools_is_plain_text() -> None:
    assert _req(tools=[WEATHER], tool_choice="none").tool_plan is None
    assert _req().tool_plan is None and sampling_settings(_req(), 5).json_schema is None


def test_legacy_functions_map_onto_tools() -> None:
    req = _req(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    plan = req.tool_plan
    assert plan is not None and plan.legacy and plan.name == "get_weather"
    assert req.template_tools() == [WEATHER]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools"),
        ({"tools": [WEATHER], "functions": [WEATHER["function"]]}, "functions"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, None),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, None),
    ],
)
def test_inconsistent_tool_fields_are_refused(extra: dict[str, Any], param: str | None) -> None:
    with pytest.raises(ValidationError) as info:
        _req(**extra)
    error = info.value.errors()[0]
    if param is not None:
        assert error.get("ctx", {}).get("param") == param, error


def test_a_json_response_format_and_a_tool_choice_are_refused_together() -> None:
    with pytest.raises(ValidationError):
        _req(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})


def test_a_named_call_streams_its_arguments_and_ends_as_tool_calls() -> None:
    plan = _req(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ).tool_plan
    assert plan is not None
    answer = ToolCallAnswer(plan)
    first, second = answer.delta('{"city":'), answer.delta('"Oslo"}')
    assert first is not None and second is not None and first.tool_calls and second.tool_calls
    head, tail = first.tool_calls[0], second.tool_calls[0]
    assert (
        head.id
        and head.id.startswith("call_")
        and head.function
        and head.function.name == "get_weather"
    )
    assert tail.id is None and tail.function and tail.function.name is None
    assert answer.last_delta("stop") == (None, "tool_calls")
    message, reason = ToolCallAnswer(plan).message('{"city":"Oslo"}', "stop")
    assert reason == "tool_calls" and message.content is None and message.tool_calls
    assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Oslo"}


def test_required_calls_are_parsed_when_the_choice_ends() -> None:
    plan = _req(tools=[WEATHER, TIME], tool_choice="required").tool_plan
    assert plan is not None
    text = (
        '[{"name":"get_weather","parameters":{"city":"Oslo"}},{"name":"get_time","parameters":{}}]'
    )
    answer = ToolCallAnswer(plan)
    assert answer.delta(text[:10]) is None and answer.delta(text[10:]) is None
    last, reason = answer.last_delta("stop")
    assert reason == "tool_calls" and last is not None and last.tool_calls
    assert [c.function.name for c in last.tool_calls if c.function] == ["get_weather", "get_time"]
    assert [c.index for c in last.tool_calls] == [0, 1]
    cut, cut_reason = ToolCallAnswer(plan).message(text[:20], "length")
    assert cut_reason == "length" and cut.content == text[:20] and cut.tool_calls is None


def test_legacy_function_call_is_answered_as_function_call() -> None:
    plan = _req(functions=[WEATHER["function"]], function_call={"name": "get_weather"}).tool_plan
    assert plan is not None
    message, reason = ToolCallAnswer(plan).message('{"city":"Oslo"}', "stop")
    assert reason == "function_call" and message.function_call is not None
    assert message.function_call.name == "get_weather" and message.tool_calls is None


def test_auto_is_openais_default_with_tools_and_leaves_the_output_free() -> None:
    for req in (_req(tools=[WEATHER]), _req(tools=[WEATHER], tool_choice="auto")):
        assert req.tool_plan is not None and req.tool_plan.mode == "auto"
        assert req.tool_schema is None
    # Free text: vLLM's own structured outputs may still shape it.
    assert _req(tools=[WEATHER], structured_outputs={"regex": "a+"}).tool_plan is not None


HERMES_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


def _auto_plan() -> ToolPlan:
    plan = _req(tools=[WEATHER]).tool_plan
    assert plan is not None
    return dataclasses.replace(plan, parser="hermes")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Just text.", "Just text.", []),
        ("Let me check. " + HERMES_CALL, "Let me check.", [("get_weather", {"city": "Oslo"})]),
        (
            '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
            "</tool_call>",
            "",
            [("a", {}), ("b", {"x": 1})],
        ),
        (HERMES_CALL + HERMES_CALL, "", [("get_weather", {"city": "Oslo"})] * 2),
        ('<tool_call>{"name": "get_weather", "argu', None, []),  # cut short: text
    ],
)
def test_the_hermes_parser_finds_calls_in_text(
    text: str, content: str | None, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    found_content, found = HermesToolParser().parse(text)
    assert found_content == (text if content is None else content)
    assert [(c.name, json.loads(c.arguments)) for c in found] == calls


def test_auto_streams_text_up_to_a_call_and_ends_with_the_calls() -> None:
    answer = ToolCallAnswer(_auto_plan())
    pieces = ["Let me ", "check. <tool", "_call>", HERMES_CALL.removeprefix("<tool_call>")]
    deltas = [answer.delta(piece) for piece in pieces]
    streamed = "".join(d.content or "" for d in deltas if d is not None)
    assert streamed == "Let me check. "  # "<tool" was held back: it could start a call
    last, reason = answer.last_delta("stop")
    assert reason == "tool_calls" and last is not None and last.tool_calls
    assert last.tool_calls[0].function is not None
    assert last.tool_calls[0].function.name == "get_weather"
    plain = ToolCallAnswer(_auto_plan())
    held = [plain.delta(piece) for piece in ("Hello <", "world")]
    assert [d.content if d else None for d in held] == ["Hello ", "<world"]
    assert plain.last_delta("stop") == (None, "stop")


def test_auto_whole_answers_carry_content_and_calls() -> None:
    message, reason = ToolCallAnswer(_auto_plan()).message("Sure. " + HERMES_CALL, "stop")
    assert reason == "tool_calls" and message.content == "Sure." and message.tool_calls
    text, text_reason = ToolCallAnswer(_auto_plan()).message("No tools needed.", "stop")
    assert text_reason == "stop" and text.content == "No tools needed." and text.tool_calls is None
