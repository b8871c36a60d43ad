"""Tool calling: OpenAI's `tools` / `tool_choice` (and the legacy `functions` /
`function_call`), served on any model through constrained decoding.

A named tool choice constrains the output to the function's JSON schema: the output is the
call's arguments. `"required"` constrains it to a JSON array of `{"name", "parameters"}` calls
(at least one; exactly one without `parallel_tool_calls`), as vLLM does. `"auto"` lets the model
write text or calls in its own format, which a deployment's parser (`schemas.tool_parsers`,
as vLLM's tool-call parsers) turns into calls; a deployment without one refuses it. `"none"`
generates text as if no tool were given.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from schemas.generation import Strict

MAX_TOOLS = 128
"""OpenAI's limit on the tools of one request."""


class FunctionDefinition(Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema (none: any JSON object)."""
    strict: bool | None = None
    """Accepted; the arguments always match the schema (constrained decoding)."""


class FunctionTool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
FunctionCallChoice = Literal["none", "auto"] | NamedFunction


class ToolsError(ValueError):
    """The tool fields of a request are inconsistent; `param` names the field to fix."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """The arguments as JSON text, as OpenAI returns them."""


@dataclass(frozen=True)
class ToolPlan:
    """How a request's output becomes tool calls."""

    mode: Literal["named", "required", "auto"]
    functions: tuple[FunctionDefinition, ...]
    name: str | None = None
    """The function of a named choice."""
    parallel: bool = True
    legacy: bool = False
    """Asked through `functions` / `function_call`: answered as `function_call`."""
    parser: str | None = None
    """`auto`: the deployment's parser of free text into calls (set at admission)."""

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema constraining the output (None for `auto`: free text)."""
        if self.mode == "auto":
            return None
        if self.mode == "named":
            return _parameters(next(f for f in self.functions if f.name == self.name))
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": f.name}, "parameters": _parameters(f)},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for f in self.functions
            ]
        }
        array: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        return array

    def calls(self, text: str) -> list[ParsedCall] | None:
        """The calls in a finished output, or None when it holds none (cut short)."""
        if self.mode == "named":
            assert self.name is not None
            return [ParsedCall(self.name, text)]
        try:
            items = json.loads(text)
        except ValueError:
            return None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return None
        return [
            ParsedCall(str(i.get("name")), json.dumps(i.get("parameters", {}), ensure_ascii=False))
            for i in items
        ]


def _parameters(function: FunctionDefinition) -> dict[str, Any]:
    return function.parameters or {"type": "object"}


def tool_plan(
    tools: list[FunctionTool] | None,
    tool_choice: ToolChoice | None,
    functions: list[FunctionDefinition] | None,
    function_call: FunctionCallChoice | None,
    parallel_tool_calls: bool | None,
) -> ToolPlan | None:
    """The plan for a request's tool fields (None: plain text), or `ToolsError` saying what
    is inconsistent. Legacy `functions` map onto tools, `function_call` onto `tool_choice`."""
    legacy = bool(functions) or function_call is not None
    if legacy and (tools or tool_choice is not None):
        raise ToolsError(
            "give tools and tool_choice, or the legacy functions, not both", "functions"
        )
    if legacy:
        defined = tuple(functions or ())
        choice: ToolChoice | None = (
            NamedToolChoice(type="function", function=function_call)
            if isinstance(function_call, NamedFunction)
            else function_call
        )
    else:
        defined = tuple(t.function for t in tools or ())
        choice = tool_choice
    if not defined:
        if choice not in (None, "none"):
            raise ToolsError("tool_choice needs tools", "tool_choice")
        return None
    if len({f.name for f in defined}) != len(defined):
        raise ToolsError("each tool needs a name of its own", "tools")
    if choice is None:
        choice = "auto"  # OpenAI's default when tools are given
    if choice == "none":
        return None
    parallel = parallel_tool_calls is not False and not legacy
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {f.name for f in defined}:
            raise ToolsError(
                f"tool_choice names {name!r}, which is not among the tools", "tool_choice"
            )
        return ToolPlan("named", defined, name=name, parallel=parallel, legacy=legacy)
    return ToolPlan(choice, defined, parallel=parallel, legacy=legacy)
