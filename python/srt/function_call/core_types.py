"""The records tool-call parsing deals in: a request's tools, a call found in the output, and
the pieces of output (content text, call deltas) that a parser hands back as text arrives."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call: its name and its parameters' JSON Schema (None: none)."""

    name: str
    parameters: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """News of call `index` (0, 1, ... in output order): its first delta carries its `id` and
    `name` (with `arguments` possibly empty), later ones further fragments of `arguments`, the
    raw JSON text of the call's arguments object."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """An OpenAI stream chunk's `tool_calls` entry."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole call: `arguments` is JSON text (an object), as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """An OpenAI message's `tool_calls` entry."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(slots=True)
class ParseDelta:
    """What one piece of output turned out to hold: text for `content`, and call deltas."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: ParseDelta) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole output: its text outside calls, and its calls in order."""

    content: str
    calls: tuple[ToolCall, ...]


def merge(deltas: Iterable[ParseDelta]) -> ParsedOutput:
    """The whole output that `deltas` describe, in order."""
    content = ""
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    for delta in deltas:
        content += delta.content
        for call in delta.calls:
            if call.id is not None and call.name is not None:
                calls[call.index] = [call.id, call.name, call.arguments]
            else:
                calls[call.index][2] += call.arguments
    return ParsedOutput(content, tuple(ToolCall(*calls[i]) for i in sorted(calls)))


def new_call_id() -> str:
    """A fresh OpenAI-style call id."""
    return f"call_{uuid.uuid4().hex[:24]}"
