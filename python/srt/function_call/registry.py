"""The tool-call formats `--tool-call-parser` chooses from (SGLang's names), and the parser a
request's `tool_choice` needs: a grammar-forced choice is parsed in the grammar's shape
whatever the flag says."""

from __future__ import annotations

from collections.abc import Sequence

from srt.function_call.base_parser import ToolCallParser
from srt.function_call.core_types import Tool
from srt.function_call.hermes import HermesParser
from srt.function_call.json_array import JsonArrayParser, NamedCallParser
from srt.function_call.llama3 import Llama3Parser

# `server_args.TOOL_CALL_PARSERS` spells these names out (tests hold the two equal).
TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3Parser,
}


def make_parser(
    choice: str, tools: Sequence[Tool], format_name: str | None, eager: bool
) -> ToolCallParser:
    """The parser of one output under `tool_choice` `choice` ("auto", "required", or "named":
    then `tools` holds the named tool only); `format_name` (the server's `--tool-call-parser`)
    is needed for "auto" only."""
    if choice == "required":
        return JsonArrayParser(tools, eager)
    if choice == "named":
        return NamedCallParser(tools, eager)
    if format_name is None:
        raise ValueError("tool_choice auto needs a --tool-call-parser")
    return TOOL_CALL_PARSERS[format_name](tools, eager)
