"""Llama 3.1/3.2/3.3's JSON format: the output starts with its calls, each a JSON object
`{"name": ..., "parameters": {...}}`, after an optional `<|python_tag|>` (which a detokenizer
that skips special tokens leaves out), several separated by `;`. `<|python_tag|>` later in the
text starts calls there too; text before it is content.

Output that starts with an object that is no call (a JSON answer, say) is content, as is the
text after the calls. A call announced and then broken (a stream only) ends there, and the rest
of the output is dropped: there is no end tag to resume after.
"""

from __future__ import annotations

from collections.abc import Sequence

from srt.function_call.base_parser import BufferedParser, held_suffix
from srt.function_call.call_streamer import MalformedCall
from srt.function_call.core_types import ParseDelta, Tool

TAG = "<|python_tag|>"
SEPARATORS = " \t\n\r;"


class Llama3Parser(BufferedParser):
    """Calls as JSON objects at the start of the output or after `<|python_tag|>`."""

    args_keys = ("parameters", "arguments")

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        super().__init__(tools, eager)
        self.mode = "start"  # start | text | calls (between calls) | call | drop

    def finish(self) -> ParseDelta:
        out = ParseDelta()
        unannounced = self.mode == "call" and not (self.current and self.current.announced)
        if self.mode in ("start", "text") or unannounced:
            out.content = self.buffer  # an unfinished call is text
        self.buffer, self.mode = "", "text"
        return out

    def _step(self, out: ParseDelta) -> bool:
        """Accounts for what it can of the buffer; whether to go on."""
        if self.mode == "start":
            rest = self.buffer.lstrip()
            if not rest or (TAG.startswith(rest) and rest != TAG):
                return False  # nothing yet, or the tag may be arriving
            if rest.startswith(TAG):
                self.buffer, self.mode = rest[len(TAG) :], "calls"
            else:
                self.mode = "calls" if rest.startswith("{") else "text"
            return True
        if self.mode == "text":
            k = self.buffer.find(TAG)
            end = k if k >= 0 else len(self.buffer) - held_suffix(self.buffer, TAG)
            out.content += self.buffer[:end]
            self.buffer = self.buffer[k + len(TAG) :] if k >= 0 else self.buffer[end:]
            self.mode = "calls" if k >= 0 else "text"
            return k >= 0
        if self.mode == "calls":
            rest = self.buffer.lstrip(SEPARATORS)
            self.buffer = rest
            if rest.startswith("{"):
                self.new_call()
                self.mode = "call"
            elif rest:
                self.mode = "text"
            return bool(rest)
        if self.mode == "drop":
            self.buffer = ""
            return False
        return self._read_call(out)

    def _read_call(self, out: ParseDelta) -> bool:
        call = self.current
        assert call is not None
        try:
            out.calls.extend(call.update(self.buffer))
        except MalformedCall:
            self.mode = "drop" if call.announced else "text"  # text: the object is content
            return not call.announced
        if call.end is None:
            return False
        self.buffer, self.mode = self.buffer[call.end :], "calls"
        return True
