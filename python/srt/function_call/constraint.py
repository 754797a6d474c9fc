"""The JSON Schemas that enforce a `tool_choice` with the request's grammar machinery (xgrammar,
like any `json_schema`): `required` is an array of one or more calls to listed tools (at most
one without `parallel_tool_calls`), each `{"name": <a tool's name>, "parameters": <its
arguments>}`; a named function is its arguments object alone. `json_array` parses both."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from srt.function_call.core_types import Tool

NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The schema of `tool`'s arguments: an object, even where its parameters do not say so."""
    if tool.parameters is None:
        return dict(NO_PARAMETERS)
    return {"type": "object", **tool.parameters}


def required_schema(tools: Sequence[Tool], parallel: bool) -> str:
    """JSON Schema text: an array of calls to `tools`, one or more (exactly one unless
    `parallel`). Each tool's `$defs` move to the root, where its `#/$defs/...` references
    point once its parameters are nested; ValueError if two tools define one name apart."""
    calls: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for tool in tools:
        parameters = arguments_schema(tool)
        for name, definition in parameters.pop("$defs", {}).items():
            if defs.setdefault(name, definition) != definition:
                raise ValueError(f"two tools define $defs/{name} differently")
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "parameters": parameters},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return json.dumps(schema)


def named_schema(tool: Tool) -> str:
    """JSON Schema text: the arguments of a call to `tool`."""
    return json.dumps(arguments_schema(tool))
