"""A chat's `messages` as chat templates take them: role and text content, an assistant's
`tool_calls` (arguments as objects) and a tool result's `tool_call_id`. Refusals are ApiError
400s naming the message's field (`messages[2].tool_call_id`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from srt.entrypoints.http.errors import bad_request
from srt.entrypoints.http.openai_tools import template_tool_calls

CHAT_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
# Message fields beyond role, content, name and refusal, by role.
MESSAGE_EXTRAS = {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}


def parse_messages(messages: Any) -> list[Mapping[str, Any]]:
    """The messages as a chat template takes them: role and text content."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of messages", "messages")
    out: list[Mapping[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"{where} must be an object with role and content", where)
        role = message.get("role")
        if role not in CHAT_ROLES:
            known = ", ".join(CHAT_ROLES)
            raise bad_request(f"{where}.role must be one of {known}, got {role!r}", f"{where}.role")
        extras = MESSAGE_EXTRAS.get(role, set())
        for key, value in message.items():
            if key not in ("role", "content", "name", "refusal", *extras) and value is not None:
                raise bad_request(f"{where}.{key} is not supported", f"{where}.{key}")
        out.append(parse_message(message, role, where))
    return out


def parse_message(message: Mapping[str, Any], role: str, where: str) -> dict[str, Any]:
    """One message as a chat template takes it. An assistant message that calls tools may have
    no content (it renders as ""); a tool result names the call it answers."""
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls is not None and message.get("content") is None:
        out: dict[str, Any] = {"role": role, "content": ""}
    else:
        out = {"role": CHAT_ROLES[role], "content": message_text(message, where)}
    if calls is not None:
        out["tool_calls"] = template_tool_calls(calls, f"{where}.tool_calls")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            field = f"{where}.tool_call_id"
            raise bad_request(f"{field} must name the call this message answers", field)
        out["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
    return out


def message_text(message: Mapping[str, Any], where: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    wanted = "a string or a list of text parts"
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be {wanted}", f"{where}.content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise bad_request(
                f"{where}.content must be {wanted}: srt serves text models only",
                f"{where}.content",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}.content text parts need a string text", f"{where}.content")
        texts.append(text)
    return "".join(texts)
