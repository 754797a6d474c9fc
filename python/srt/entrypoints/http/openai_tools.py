"""OpenAI's tool calling in a chat request: `tools`, `tool_choice` and `parallel_tool_calls`
checked and turned into a `ToolPlan`, and the tool parts of `messages` (an assistant's
`tool_calls`, `tool` results) into what chat templates take.

`tool_choice` `none` (the default without tools) leaves the tools out of the prompt and the
output as text. `auto` (the default with tools) renders them and lets the model choose; the
server's `--tool-call-parser` finds its calls, so `auto` needs one. `required` and a named
function are enforced: the request gets a JSON Schema (`function_call.constraint`) that the
output must follow, so it is a call whatever the model's weights, and no parser flag is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srt.constrained.schema_rewrite import refusal
from srt.entrypoints.http.errors import bad_request
from srt.function_call.base_parser import ToolCallParser
from srt.function_call.constraint import named_schema, required_schema
from srt.function_call.core_types import Tool
from srt.function_call.registry import TOOL_CALL_PARSERS, make_parser

# OpenAI's rule for function names.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_KEYS = {"type", "function"}
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request's output may call tools: `choice` is "auto", "required" or "named"
    (then `tools` holds the named tool only)."""

    tools: tuple[Tool, ...]
    choice: str
    parallel: bool
    format_name: str | None
    """The server's `--tool-call-parser` (for "auto")."""

    def parser(self, eager: bool) -> ToolCallParser:
        """A parser for one output (`eager` for a stream)."""
        return make_parser(self.choice, self.tools, self.format_name, eager)

    def json_schema(self) -> str | None:
        """The schema that forces a call, for "required" and "named"; ApiError 400 if the
        tools' schemas cannot be combined."""
        if self.choice == "required":
            try:
                return required_schema(self.tools, self.parallel)
            except ValueError as e:
                raise bad_request(str(e), "tools") from e
        if self.choice == "named":
            return named_schema(self.tools[0])
        return None


def parse_tools(
    body: Mapping[str, Any], format_name: str | None
) -> tuple[list[Mapping[str, Any]] | None, ToolPlan | None]:
    """The tools to render into the prompt (OpenAI's objects, as chat templates take them), and
    the plan for the output; (None, None) without tool calling. ApiError 400 naming the field."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if raw is None:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None, None
    if not isinstance(raw, list) or not raw:
        raise bad_request("tools must be a non-empty list of tools", "tools")
    tools = [check_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw)]
    names = [tool.name for tool in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_request(f"two tools are named {name!r}", f"tools[{i}].function.name")
    choice = "auto" if choice is None else choice  # OpenAI's default with tools
    if choice == "none":
        return None, None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        named = function.get("name") if isinstance(function, Mapping) else None
        if choice.get("type") != "function" or not isinstance(named, str):
            raise bad_request(
                'a named tool_choice must be {"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        if named not in names:
            raise bad_request(f"tool_choice names {named!r}, which is not in tools", "tool_choice")
        tools, choice = [tools[names.index(named)]], "named"
    elif choice not in ("auto", "required"):
        raise bad_request(
            f"tool_choice must be none, auto, required or a named function, got {choice!r}",
            "tool_choice",
        )
    if choice == "auto" and format_name is None:
        raise bad_request(
            "tool_choice auto (the default with tools) needs the server started with "
            f"--tool-call-parser ({', '.join(TOOL_CALL_PARSERS)}); required and a named "
            "function are forced by a grammar and need none",
            "tool_choice",
        )
    plan = ToolPlan(tuple(tools), choice, parallel is not False, format_name)
    return [dict(tool) for tool in raw], plan


def check_tool(tool: Any, where: str) -> Tool:
    """One of `tools`: `{"type": "function", "function": {"name", "description",
    "parameters", "strict"}}`, its parameters a JSON Schema of an object."""
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        raise bad_request(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
    function = tool.get("function")
    if not isinstance(function, Mapping) or set(tool) - TOOL_KEYS or set(function) - FUNCTION_KEYS:
        raise bad_request(
            f"{where}.function must be an object with name, description, parameters, strict",
            f"{where}.function",
        )
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise bad_request(
            f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r:.80}",
            f"{where}.function.name",
        )
    if not isinstance(function.get("description", ""), str | None):
        raise bad_request(f"{where}.function.description must be a string", f"{where}.function")
    if not isinstance(function.get("strict", False), bool | None):
        raise bad_request(f"{where}.function.strict must be true or false", f"{where}.function")
    params = function.get("parameters")
    field = f"{where}.function.parameters"
    if params is not None and not isinstance(params, Mapping):
        raise bad_request(f"{field} must be a JSON Schema object", field)
    if params is not None and params.get("type", "object") != "object":
        raise bad_request(f"{field} must be the JSON Schema of an object", field)
    refused = None if params is None else refusal(json.dumps(params))
    if refused is not None:
        raise bad_request(f"{field} is refused: {refused}", field)
    return Tool(name, params)


def template_tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as chat templates take them: arguments as objects
    (OpenAI sends them as JSON text; templates write them out with `tojson`)."""
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a list of tool calls", where)
    out = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad_request(f'{at} must be {{"id", "type": "function", "function"}}', at)
        if call.get("type", "function") != "function" or not isinstance(call.get("id", ""), str):
            raise bad_request(f'{at} must be {{"id", "type": "function", "function"}}', at)
        try:
            arguments = json.loads(function.get("arguments", "{}"))
        except (TypeError, ValueError):
            arguments = None
        if not isinstance(arguments, dict):
            raise bad_request(
                f"{at}.function.arguments must be a JSON object as text", f"{at}.function"
            )
        function = {"name": function["name"], "arguments": arguments}
        out.append({"id": call.get("id"), "type": "function", "function": function})
    return out
