"""`CallStreamer`: one call object, `{"name": ..., "arguments": {...}}` (the arguments' key
depends on the format), read as its text arrives, turned into `ToolCallDelta`s."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

from srt.function_call.core_types import ToolCallDelta, new_call_id
from srt.function_call.json_scan import JsonSyntaxError, PartialObject, scan_object


class MalformedCall(ValueError):
    """The text is not (the start of) a call to one of the request's tools."""


class CallStreamer:
    """Call `index` of an output, to one of `names`, its arguments under one of `args_keys`.

    Eager (a stream): the call is announced once its name is read, and its arguments' text goes
    out as it comes. Not eager (a whole output): only once the object is complete, so that a
    call that breaks later is never half announced. Once announced, a call stays one: a stream
    cannot take back what it sent."""

    def __init__(
        self, index: int, names: Collection[str], args_keys: Sequence[str], eager: bool
    ) -> None:
        self.index = index
        self.names = names
        self.args_keys = args_keys
        self.eager = eager
        self.announced = False
        self.sent = 0  # characters of the arguments' text sent
        self.end: int | None = None
        """Index just past the object in the latest text, once it is complete."""

    def update(self, text: str) -> list[ToolCallDelta]:
        """The deltas that `text` (the object's text from its start, so far; what follows the
        object is not read) adds; MalformedCall if it cannot be a call."""
        try:
            obj = scan_object(text)
        except JsonSyntaxError as e:
            raise MalformedCall(str(e)) from e
        name = self._name(text, obj)
        args = self._arguments(text, obj)
        if obj.end is not None:
            if name is None:
                raise MalformedCall("a call needs a name")
            args = "{}" if args is None else args  # no arguments: a function of none
        self.end = obj.end
        if name is None or (obj.end is None and not self.eager):
            return []
        args = args or ""
        fragment = args[self.sent :]
        self.sent = len(args)
        if not self.announced:
            self.announced = True
            return [ToolCallDelta(self.index, fragment, new_call_id(), name)]
        return [ToolCallDelta(self.index, fragment)] if fragment else []

    def _name(self, text: str, obj: PartialObject) -> str | None:
        span = obj.members.get("name")
        if span is None:
            return None
        name = json.loads(text[span[0] : span[1]])
        if name not in self.names:
            raise MalformedCall(f"no tool is named {name!r}")
        return str(name)

    def _arguments(self, text: str, obj: PartialObject) -> str | None:
        """The arguments' text so far (an object's raw text; a string holding JSON, decoded),
        None while there is none to send."""
        for key in self.args_keys:
            span = obj.members.get(key)
            if span is not None:
                raw = text[span[0] : span[1]]
                if raw.startswith("{"):
                    return raw
                if raw.startswith('"'):  # arguments given as JSON text
                    decoded = json.loads(raw)
                    try:
                        is_object = isinstance(json.loads(decoded), dict)
                    except ValueError:
                        is_object = False
                    if is_object:
                        return str(decoded)
                raise MalformedCall(f"{key} must be a JSON object")
            if obj.open is not None and obj.open[0] == key:
                start = obj.open[1]
                return text[start:] if text.startswith("{", start) else None
        return None
