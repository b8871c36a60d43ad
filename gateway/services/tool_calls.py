"""One choice's generated text as OpenAI tool calls, whole or streamed as deltas.

With a named tool choice the text is the call's arguments, so it streams as argument deltas
as it is generated. With `"required"` the text is a JSON array of calls: it is parsed once
the choice ends, and its calls go out whole in one delta. A choice cut short (`length`) that
holds no complete array is answered as text. With `"auto"` the model writes text or calls
in its own format: text streams as content up to where a call might start, and the
deployment's parser finds the calls when the choice ends.
"""

from __future__ import annotations

from schemas.chat import (
    ChatCompletionMessage,
    ChoiceDelta,
    ChoiceDeltaFunction,
    ChoiceDeltaToolCall,
    FinishReason,
    FunctionCall,
    ToolCall,
)
from schemas.tool_parsers import TOOL_CALL_PARSERS
from schemas.tools import ParsedCall, ToolPlan, new_call_id


class ToolCallAnswer:
    """Turns one choice's output into tool calls, following the request's `ToolPlan`."""

    def __init__(self, plan: ToolPlan) -> None:
        self._plan = plan
        self._text: list[str] = []
        self._first_id = new_call_id()
        self._streamed = False
        self._parser = TOOL_CALL_PARSERS[plan.parser]() if plan.parser else None
        self._sent = 0  # characters of an `auto` answer streamed as content so far

    def finish_reason(self, reason: FinishReason, calls: bool = True) -> FinishReason:
        """A choice that ended on its own with calls ended to call them."""
        if reason != "stop" or not calls:
            return reason
        return "function_call" if self._plan.legacy else "tool_calls"

    def message(
        self, text: str, reason: FinishReason
    ) -> tuple[ChatCompletionMessage, FinishReason]:
        """The whole answer: the calls (or the text, when it holds none) and finish reason."""
        content: str | None = None
        if self._parser is not None:
            before, found = self._parser.parse(text)
            calls: list[ParsedCall] | None = found or None
            content = before or None
        else:
            calls = self._plan.calls(text)
        if calls is None:
            return ChatCompletionMessage(content=text), self.finish_reason(reason, calls=False)
        if self._plan.legacy:
            call = calls[0]
            message = ChatCompletionMessage(
                content=content,
                function_call=FunctionCall(name=call.name, arguments=call.arguments),
            )
        else:
            message = ChatCompletionMessage(content=content, tool_calls=self._tool_calls(calls))
        return message, self.finish_reason(reason)

    def delta(self, text: str) -> ChoiceDelta | None:
        """What to stream for newly generated text (None: it waits for the choice's end)."""
        self._text.append(text)
        if self._parser is not None:  # auto: content streams up to where a call may start
            full = "".join(self._text)
            safe = self._parser.content_prefix(full)
            if safe <= self._sent:
                return None
            content, self._sent = full[self._sent : safe], safe
            return ChoiceDelta(content=content)
        if self._plan.mode != "named" or not text:
            return None
        first = not self._streamed
        self._streamed = True
        name = self._plan.name if first else None
        if self._plan.legacy:
            return ChoiceDelta(function_call=ChoiceDeltaFunction(name=name, arguments=text))
        return ChoiceDelta(
            tool_calls=[
                ChoiceDeltaToolCall(
                    index=0,
                    id=self._first_id if first else None,
                    type="function" if first else None,
                    function=ChoiceDeltaFunction(name=name, arguments=text),
                )
            ]
        )

    def last_delta(self, reason: FinishReason) -> tuple[ChoiceDelta | None, FinishReason]:
        """What is left to stream when the choice ends, and its finish reason."""
        if self._plan.mode == "named":
            return None, self.finish_reason(reason, calls=self._streamed)
        text = "".join(self._text)
        rest: str | None = None
        if self._parser is not None:
            _, found = self._parser.parse(text)
            calls = found or None
            end = self._parser.content_prefix(text) if calls else len(text)
            rest = text[self._sent : end].rstrip() if calls else text[self._sent : end]
            if calls is None:
                return (ChoiceDelta(content=rest) if rest else None), reason
        else:
            calls = self._plan.calls(text)
        if calls is None:
            return ChoiceDelta(content=text), self.finish_reason(reason, calls=False)
        if self._plan.legacy:  # auto through the legacy fields: one function_call
            call = calls[0]
            legacy = ChoiceDeltaFunction(name=call.name, arguments=call.arguments)
            return ChoiceDelta(content=rest or None, function_call=legacy), self.finish_reason(
                reason
            )
        deltas = [
            ChoiceDeltaToolCall(
                index=i,
                id=call.id,
                type="function",
                function=ChoiceDeltaFunction(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            for i, call in enumerate(self._tool_calls(calls))
        ]
        return ChoiceDelta(content=rest or None, tool_calls=deltas), self.finish_reason(reason)

    def _tool_calls(self, calls: list[ParsedCall]) -> list[ToolCall]:
        return [
            ToolCall(
                id=self._first_id if i == 0 else new_call_id(),
                function=FunctionCall(name=call.name, arguments=call.arguments),
            )
            for i, call in enumerate(calls)
        ]
