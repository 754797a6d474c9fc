"""The output a `tool_choice` grammar forces (`constraint`): with `required`, a JSON array of
`{"name": ..., "parameters": {...}}` objects (SGLang's and vLLM's shape); with a named function,
that function's arguments object alone. Any tool-call parser's format is ignored then: the
grammar, not the model's habits, decides the text.

The grammar makes the text well formed unless the output was cut short (`max_tokens`): what
was not a complete call by then is content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from srt.function_call.base_parser import BufferedParser, ToolCallParser
from srt.function_call.call_streamer import MalformedCall
from srt.function_call.core_types import ParseDelta, Tool, ToolCallDelta, new_call_id
from srt.function_call.json_scan import WHITESPACE

_BETWEEN = WHITESPACE + ",[]"


class JsonArrayParser(BufferedParser):
    """Calls as the items of one JSON array."""

    args_keys = ("parameters", "arguments")

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        super().__init__(tools, eager)
        self.mode = "start"  # start | between (calls) | call | text (the rest is content)

    def finish(self) -> ParseDelta:
        out = ParseDelta()
        call = self.current
        if self.mode in ("start", "text") or (self.mode == "call" and call and not call.announced):
            out.content = self.buffer
        self.buffer, self.mode = "", "text"
        return out

    def _step(self, out: ParseDelta) -> bool:
        if self.mode == "start":
            rest = self.buffer.lstrip(WHITESPACE)
            if rest:
                self.mode = "between" if rest.startswith("[") else "text"
                self.buffer = rest[1:] if self.mode == "between" else rest
            return bool(rest)
        if self.mode == "text":
            out.content += self.buffer
            self.buffer = ""
            return False
        if self.mode == "between":
            rest = self.buffer.lstrip(_BETWEEN)
            self.buffer = rest
            if rest:
                self.mode = "call" if rest.startswith("{") else "text"
                if self.mode == "call":
                    self.new_call()
            return bool(rest)
        call = self.current
        assert call is not None
        try:
            out.calls.extend(call.update(self.buffer))
        except MalformedCall:
            self.mode = "text"
            return not call.announced
        if call.end is None:
            return False
        self.buffer, self.mode = self.buffer[call.end :], "between"
        return True


class NamedCallParser(ToolCallParser):
    """One call to the one tool named: the whole output is its arguments object."""

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        super().__init__(tools, eager)
        (self.name,) = self.names
        self.id = new_call_id()
        self.text = ""
        self.started = False

    @property
    def called(self) -> bool:
        return self.started

    def feed(self, text: str) -> ParseDelta:
        if not self.eager:
            self.text += text
            return ParseDelta()
        first, self.started = not self.started, True
        if first:
            return ParseDelta(calls=[ToolCallDelta(0, text, self.id, self.name)])
        return ParseDelta(calls=[ToolCallDelta(0, text)] if text else [])

    def finish(self) -> ParseDelta:
        if self.eager:
            return self.feed("") if not self.started else ParseDelta()
        try:
            is_object = isinstance(json.loads(self.text), dict)
        except ValueError:
            is_object = False
        if not is_object:
            return ParseDelta(content=self.text)
        self.started = True
        return ParseDelta(calls=[ToolCallDelta(0, self.text, self.id, self.name)])
