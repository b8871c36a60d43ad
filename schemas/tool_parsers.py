"""Parsers of a model's free text into tool calls, for `tool_choice: "auto"`.

Which one a model needs depends on the format its chat template taught it; a deployment names
it (`Deployment.tool_call_parser`), as vLLM's `--tool-call-parser` does. Each parser finds the
calls in a finished text and says how much of a growing text is surely plain content (so that
content streams while a call might still be starting).
"""

from __future__ import annotations

import json
import re
from typing import Literal, Protocol

from schemas.tools import ParsedCall

ToolCallParserName = Literal["hermes"]


class ToolCallParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(the content outside calls, the calls) of a finished text."""
        ...

    def content_prefix(self, text: str) -> int:
        """How many leading characters of a growing text are content whatever follows."""
        ...


class HermesToolParser:
    """Hermes' format, used by Qwen2.5, Hermes and SmolLM2 templates among others: each call
    is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (a JSON list of such
    objects inside one pair of tags is accepted too)."""

    START, END = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.START)
        if start < 0:
            return text, []
        calls: list[ParsedCall] = []
        for body in self._CALL.findall(text[start:]):
            try:
                item = json.loads(body)
            except ValueError:
                return text, []  # a call cut short (or not a call): keep the text as it is
            for one in item if isinstance(item, list) else [item]:
                if not isinstance(one, dict) or not isinstance(one.get("name"), str):
                    return text, []
                arguments = one.get("arguments", one.get("parameters", {}))
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                calls.append(ParsedCall(one["name"], arguments))
        return text[:start].strip(), calls

    def content_prefix(self, text: str) -> int:
        start = text.find(self.START)
        if start >= 0:
            return start
        for keep in range(min(len(self.START) - 1, len(text)), 0, -1):
            if self.START.startswith(text[-keep:]):  # a tag may be starting: hold it back
                return len(text) - keep
        return len(text)


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesToolParser}
