"""Reading a JSON object whose text is still arriving: which members are complete, where they
lie in the text, and which member is being written. Parsers stream a call's arguments as the
raw text of its arguments object, so they need positions, not values.

Every complete member value is checked with `json.loads`; an incomplete one only for what its
text so far rules out (a wrong start, a mismatched bracket), so a broken call is seen as early
as the text allows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"
_SCALAR_START = "-0123456789tfn"
_SCALAR_END = WHITESPACE + ",}]"
_CLOSER = {"{": "}", "[": "]"}


class JsonSyntaxError(ValueError):
    """The text cannot be the start of the JSON expected there."""


@dataclass
class PartialObject:
    """A JSON object's text so far. `members`: complete members, key -> (start, end) of the
    value's text; `open`: (key, value start) of the member whose value is incomplete; `end`:
    the index just past the closing brace, once there is one."""

    members: dict[str, tuple[int, int]] = field(default_factory=dict)
    open: tuple[str, int] | None = None
    end: int | None = None


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def value_end(text: str, i: int) -> int | None:
    """The index just past the JSON value starting at `text[i]`, None if the text ends first;
    JsonSyntaxError if no JSON value starts there, or its text breaks bracket nesting."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in _CLOSER:
        return _nested_end(text, i)
    if c not in _SCALAR_START:
        raise JsonSyntaxError(f"no JSON value starts with {c!r}")
    j = i
    while j < len(text) and text[j] not in _SCALAR_END:
        j += 1
    return j if j < len(text) else None  # a number may go on


def _string_end(text: str, i: int) -> int | None:
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        else:
            j += 1
    return None


def _nested_end(text: str, i: int) -> int | None:
    expected = [_CLOSER[text[i]]]
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in _CLOSER:
            expected.append(_CLOSER[c])
        elif c in "}]":
            if c != expected.pop():
                raise JsonSyntaxError(f"mismatched {c!r}")
            if not expected:
                return j + 1
        j += 1
    return None


def scan_object(text: str, start: int = 0) -> PartialObject:
    """The object whose text starts at `text[start]` (after whitespace), read as far as `text`
    goes; what follows its closing brace is not read. JsonSyntaxError if the text cannot be
    the start of an object."""
    out = PartialObject()
    i = skip_whitespace(text, start)
    if i == len(text):
        return out
    if text[i] != "{":
        raise JsonSyntaxError("a call must be a JSON object")
    i = skip_whitespace(text, i + 1)
    if text.startswith("}", i):
        out.end = i + 1
        return out
    while i < len(text):
        if text[i] != '"':
            raise JsonSyntaxError("expected a member name")
        key_end = _string_end(text, i)
        if key_end is None:
            return out
        key = str(_load(text[i:key_end]))
        i = skip_whitespace(text, key_end)
        if i == len(text):
            return out
        if text[i] != ":":
            raise JsonSyntaxError("expected ':' after a member name")
        i = skip_whitespace(text, i + 1)
        if i == len(text):
            return out
        end = value_end(text, i)
        if end is None:
            out.open = (key, i)
            return out
        _load(text[i:end])
        out.members[key] = (i, end)
        i = skip_whitespace(text, end)
        if i == len(text):
            return out
        if text[i] == "}":
            out.end = i + 1
            return out
        if text[i] != ",":
            raise JsonSyntaxError("expected ',' or '}' after a member")
        i = skip_whitespace(text, i + 1)
    return out


def _load(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as e:
        raise JsonSyntaxError(str(e)) from e
