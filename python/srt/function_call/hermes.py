"""Hermes' format, which Qwen 2.5/3 and NousResearch's Hermes models use: each call a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`, anywhere in the
text, as many as the model likes.

A block that does not hold a call (bad JSON, an unknown tool) stays in the content, tags and
all; a block whose call was announced and then broke (a stream only) ends the call there, and
the rest of the block is dropped. Whitespace around a call inside its block is framing, not
content; a missing `</tool_call>` at the end of the output is forgiven.
"""

from __future__ import annotations

from collections.abc import Sequence

from srt.function_call.base_parser import BufferedParser, held_suffix
from srt.function_call.call_streamer import MalformedCall
from srt.function_call.core_types import ParseDelta, Tool

START = "<tool_call>"
END = "</tool_call>"


class HermesParser(BufferedParser):
    """Calls in `<tool_call>` blocks."""

    args_keys = ("arguments", "parameters")

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        super().__init__(tools, eager)
        self.mode = "text"  # text | call | pass (a rejected block, as content) | drop

    def finish(self) -> ParseDelta:
        out = ParseDelta()
        if self.mode in ("text", "pass"):
            out.content = self.buffer
        elif self.mode == "call":
            self._end_block(self.buffer, out)
        self.buffer, self.mode = "", "text"
        return out

    def _step(self, out: ParseDelta) -> bool:
        """Accounts for what it can of the buffer; whether to go on."""
        marker = START if self.mode == "text" else END
        k = self.buffer.find(marker)
        if self.mode in ("text", "pass"):
            end = k if k >= 0 else len(self.buffer) - held_suffix(self.buffer, marker)
            if self.mode == "pass" and k >= 0:
                end += len(END)
            out.content += self.buffer[:end]
            if k < 0:
                self.buffer = self.buffer[end:]
                return False
            self.buffer = self.buffer[k + len(marker) :]
            if self.mode == "text":
                self.new_call()
            self.mode = "call" if self.mode == "text" else "text"
            return True
        if self.mode == "drop":
            if k < 0:
                self.buffer = self.buffer[len(self.buffer) - held_suffix(self.buffer, END) :]
                return False
            self.buffer, self.mode = self.buffer[k + len(END) :], "text"
            return True
        if k < 0:  # the block goes on: read the call so far (not a tag that may be arriving)
            body = self.buffer[: len(self.buffer) - held_suffix(self.buffer, END)]
            return not self._read(body, out)  # a broken call: its mode reads the rest
        if self._end_block(self.buffer[:k], out):
            out.content += END
        self.buffer, self.mode = self.buffer[k + len(END) :], "text"
        return True

    def _read(self, body: str, out: ParseDelta) -> bool:
        """Reads the call so far; False if it broke (the mode then says what comes next)."""
        assert self.current is not None
        try:
            out.calls.extend(self.current.update(body))
            return True
        except MalformedCall:
            if self.current.announced:
                self.mode = "drop"
            else:
                self.mode = "pass"
                out.content += START
            return False

    def _end_block(self, body: str, out: ParseDelta) -> bool:
        """The block holding `body` ended (its end tag, or the output's end); whether it turned
        out to be content."""
        call = self.current
        assert call is not None
        if not self._read(body, out):
            if self.mode == "pass":
                out.content += body
            return self.mode == "pass"
        if call.end is not None:
            trailing = body[call.end :]
            out.content += trailing if trailing.strip() else ""
            return False
        if call.announced:  # cut off: the call ends where its text did
            return False
        out.content += START + body
        return True
