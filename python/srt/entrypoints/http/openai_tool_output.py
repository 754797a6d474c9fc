"""A chat choice's output read for tool calls (`ToolPlan`): the whole message of an answer, or a
stream's deltas choice by choice. Calls go into `tool_calls`, the text around them into
`content`, and a choice that called a tool and stopped by itself ends with finish reason
"tool_calls" (one cut short keeps "length")."""

from __future__ import annotations

from typing import Any

from srt.entrypoints.http.openai_tools import ToolPlan


def chat_message(
    plan: ToolPlan | None, text: str, reason: str | None
) -> tuple[dict[str, Any], str | None]:
    """The message of a whole output `text` that ended for `reason`, and the finish reason."""
    if plan is None:
        return {"role": "assistant", "content": text}, reason
    parsed = plan.parser(eager=False).parse(text)
    if not parsed.calls:
        return {"role": "assistant", "content": parsed.content}, reason
    message = {
        "role": "assistant",
        "content": parsed.content if parsed.content.strip() else None,
        "tool_calls": [call.to_openai() for call in parsed.calls],
    }
    return message, "tool_calls" if reason == "stop" else reason


class ToolCallStream:
    """One streamed choice's output, read for calls as its text arrives."""

    def __init__(self, plan: ToolPlan) -> None:
        self.parser = plan.parser(eager=True)

    def delta(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The chunk delta for the choice's next `text` (the last when `reason` is set), and
        the finish reason."""
        news = self.parser.feed(text)
        if reason is not None:
            news.extend(self.parser.finish())
        delta: dict[str, Any] = {}
        if news.content or not news.calls:
            delta["content"] = news.content
        if news.calls:
            delta["tool_calls"] = [call.to_openai() for call in news.calls]
        if reason == "stop" and self.parser.called:
            reason = "tool_calls"
        return delta, reason
