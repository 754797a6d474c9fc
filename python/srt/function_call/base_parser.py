"""`ToolCallParser`: the interface every format implements, and the bookkeeping they share.

A parser reads one output: `feed` takes its text piece by piece (a stream's deltas) and says
what each piece turned out to be, holding back text that may be the start of a call until it
knows; `finish` flushes what is held back once the output ended. `parse` reads a whole output
the same way in one piece. Text outside calls is content; a call that breaks before it is
announced (malformed JSON, an unknown tool, a cut-off output) is content too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from srt.function_call.call_streamer import CallStreamer
from srt.function_call.core_types import ParseDelta, ParsedOutput, Tool, merge


class ToolCallParser(ABC):
    """Finds calls to `tools` in one output. `eager`: announce calls as soon as their name is
    read (streams); otherwise once each is complete (whole outputs)."""

    args_keys: Sequence[str] = ("arguments", "parameters")
    """The member names a format's call objects give their arguments under."""

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        self.names = frozenset(tool.name for tool in tools)
        self.eager = eager
        self.announced = 0  # calls announced before the current one
        self.current: CallStreamer | None = None

    @abstractmethod
    def feed(self, text: str) -> ParseDelta:
        """What the output's next piece of text adds (content, call deltas)."""

    @abstractmethod
    def finish(self) -> ParseDelta:
        """What the text held back adds, now that the output has ended."""

    def parse(self, text: str) -> ParsedOutput:
        """A whole output's content and calls."""
        return merge([self.feed(text), self.finish()])

    @property
    def called(self) -> bool:
        """Whether any call was announced (the finish reason becomes "tool_calls")."""
        return self.announced > 0 or (self.current is not None and self.current.announced)

    def new_call(self) -> CallStreamer:
        """A streamer for the output's next call. Indexes count announced calls only: one that
        broke before it was announced leaves no gap."""
        if self.current is not None and self.current.announced:
            self.announced += 1
        self.current = CallStreamer(self.announced, self.names, self.args_keys, self.eager)
        return self.current


class BufferedParser(ToolCallParser):
    """A parser that scans a buffer of the text received, step by step (`_step`), each step
    accounting for what it can."""

    def __init__(self, tools: Sequence[Tool], eager: bool = False) -> None:
        super().__init__(tools, eager)
        self.buffer = ""  # text received and not yet accounted for

    def feed(self, text: str) -> ParseDelta:
        self.buffer += text
        out = ParseDelta()
        while self._step(out):
            pass
        return out

    @abstractmethod
    def _step(self, out: ParseDelta) -> bool:
        """Accounts for what it can of `buffer` into `out`; whether to go on."""


def held_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that `marker` starts with (and is shorter than
    it): text to hold back, since the marker may be arriving."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
