"""The grammar sampling parameters (`json_schema`, `regex`, `ebnf`) as the main process reads
them: converters for `generate_req_input.sampling_kwargs` that refuse, before anything is
queued, what cannot be a grammar of its kind.

The main process never imports torch, and xgrammar does, so these checks are the ones that need
no compiler: a schema must be JSON text (or a JSON value, serialized here) holding an object or
a boolean, whose keywords srt enforces (`constrained.schema_rewrite`, pure Python); a regex must
compile with Python's `re` (whose syntax xgrammar's is close to), and an EBNF grammar must define
the start rule `root`. The scheduler's compile is the final word: what passes here and still
fails to compile is refused with a 400 naming the field there (`Scheduler.add_request`), before
the request waits for memory.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

from srt.constrained.schema_rewrite import refusal
from srt.request_limits import RequestError

# An EBNF grammar's start rule, at the start of a line (xgrammar's default root rule name).
_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)


def _fail(name: str, message: str) -> typing.NoReturn:
    raise RequestError(f"sampling parameter {name} {message}", name)


def to_json_schema(name: str, value: Any) -> str:
    """The schema as JSON text: a string is parsed to check it, an object or boolean given as a
    JSON value is serialized (keeping its key order, which is the order properties come out)."""
    if isinstance(value, str):
        try:
            schema = json.loads(value)
        except ValueError as e:
            _fail(name, f"must be a JSON Schema as JSON text: {e}")
    else:
        schema = value
    if not isinstance(schema, Mapping | bool):
        _fail(name, f"must be a JSON Schema (an object or a boolean), got {schema!r:.80}")
    text = value if isinstance(value, str) else json.dumps(schema)
    refused = refusal(text)
    if refused is not None:
        _fail(name, f"is refused: {refused}")
    return text


def to_regex(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        _fail(name, f"must be a non-empty regular expression string, got {value!r:.80}")
    try:
        re.compile(value)
    except re.error as e:
        _fail(name, f"is not a valid regular expression: {e}")
    return value


def to_ebnf(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _ROOT_RULE.search(value):
        _fail(name, "must be an EBNF grammar string defining the start rule `root ::= ...`")
    return value


GRAMMAR_CONVERTERS: dict[str, Callable[[str, Any], str]] = {
    "json_schema": to_json_schema,
    "regex": to_regex,
    "ebnf": to_ebnf,
}
