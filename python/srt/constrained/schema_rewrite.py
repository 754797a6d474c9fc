"""A JSON Schema checked keyword by keyword (`schema_keywords`), its bounded strings taken out.

xgrammar 0.2.9 compiles a string bounded by `minLength`, `maxLength` or `pattern` to a class of
raw characters that lets control characters through and leaves escapes out. `rewrite` puts a
`const` marker (a string the schema does not hold) in place of each such string and keeps the
grammar of each aside (`json_chars`, `json_pattern`); `schema_grammar` compiles the marked
schema with xgrammar and splices the strings' grammars in where the markers' literals are.
Everything else stays xgrammar's. A schema without bounded strings comes back unchanged, with
no markers, and compiles as it always did.

Pure Python, no xgrammar: the main process runs it too, to refuse a schema before it queues.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from srt.constrained import json_pattern
from srt.constrained.json_chars import string_rule
from srt.constrained.json_pattern import PatternError
from srt.constrained.schema_keywords import (
    ANNOTATIONS,
    FORMATS,
    REFUSED,
    STRING_BOUNDS,
    SchemaError,
)
from srt.constrained.schema_oneof import disjoint
from srt.constrained.schema_values import allowed_values

_SINGLE = (
    "additionalProperties",
    "items",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
# What may sit beside $ref, anyOf, oneOf and allOf: xgrammar ignores every other keyword there.
_QUIET = frozenset(ANNOTATIONS) | {"$defs", "definitions"}


@dataclass
class Rewrite:
    """The schema for xgrammar (`schema`) made from `root`, and for each marker it holds as a
    `const`, the EBNF rule of the string it stands for (`rules`, named `srt_string_<i>`);
    markers are `srtstring<nonce>x<i>x`, the nonce one the schema's text does not hold."""

    schema: Any
    root: Any
    nonce: str
    rules: dict[str, str] = field(default_factory=dict)

    def marker(self, min_length: int, max_length: int | None, pattern: str | None) -> str:
        """A new marker for a string of `min_length` to `max_length` characters matching
        `pattern`, its rule kept; PatternError for a pattern no rule can hold."""
        index = len(self.rules)
        name = f"srt_string_{index}"
        if pattern is None:
            rule = string_rule(name, min_length, max_length)
        else:
            node = json_pattern.bounded(json_pattern.parse(pattern), min_length, max_length)
            rule = f'{name} ::= "\\"" {json_pattern.to_ebnf(node)} "\\""'
        marker = f"srtstring{self.nonce}x{index}x"
        self.rules[marker] = rule
        return marker


def rewrite(schema: Any) -> Rewrite:
    """`schema` checked, its bounded strings replaced by markers; SchemaError if srt refuses it."""
    text = json.dumps(schema)
    nonce = next(str(n) for n in itertools.count() if f"srtstring{n}x" not in text)
    result = Rewrite(schema=None, root=schema, nonce=nonce)
    result.schema = _walk(schema, "", result)
    return result


@functools.lru_cache(maxsize=256)
def refusal(text: str) -> SchemaError | None:
    """Why srt refuses the JSON Schema of JSON text `text`, or None (cached by text: the main
    process asks for every request)."""
    try:
        rewrite(json.loads(text))
    except SchemaError as e:
        return e
    except RecursionError:
        return SchemaError("schema", "", "is nested too deeply")
    return None


def _walk(node: Any, path: str, out: Rewrite) -> Any:
    if isinstance(node, bool):
        return node
    if not isinstance(node, Mapping):
        raise SchemaError("schema", path, f"must be an object or a boolean, got {node!r:.60}")
    _check(node, path, out)
    if "enum" in node or "const" in node:
        values = node["enum"] if "enum" in node else [node["const"]]
        kept = allowed_values(node, path, _QUIET)
        if kept == values:
            return dict(node)  # what xgrammar writes already satisfies the rest
        return {**{k: v for k, v in node.items() if k in ANNOTATIONS}, "enum": kept}
    if any(k in node for k in STRING_BOUNDS):
        return _bounded_string(node, path, out)
    if isinstance(node.get("required"), list):
        node = _with_required_properties(node, path)
    new: dict[str, Any] = {}
    for key, value in node.items():
        where = f"{path}/{_escape(key)}"
        if key in _SINGLE and not isinstance(value, bool | Mapping):
            raise SchemaError(key, path, "must be a schema (an array of schemas: use prefixItems)")
        if key in _SINGLE:
            new[key] = _walk(value, where, out)
        elif key in _MAPS and isinstance(value, Mapping):
            new[key] = {k: _walk(v, f"{where}/{_escape(k)}", out) for k, v in value.items()}
        elif key in _LISTS and isinstance(value, list):
            new[key] = [_walk(v, f"{where}/{i}", out) for i, v in enumerate(value)]
        else:
            new[key] = value
    return new


def _with_required_properties(node: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """`node` with each required name its `properties` lack listed there, under the schema
    `additionalProperties` gives it: xgrammar writes only listed properties (and none beside
    them unless asked), so it left a required one out."""
    properties = node.get("properties", {})
    missing = [n for n in node["required"] if isinstance(n, str) and n not in properties]
    if not missing or not isinstance(properties, Mapping):
        return node
    extra = node.get("additionalProperties", True)
    if extra is False or "patternProperties" in node:
        why = "names properties that additionalProperties false forbids"
        if extra is not False:
            why = "names properties beside patternProperties, which are refused"
        raise SchemaError("required", path, f"{why}: {', '.join(missing)}")
    listed = {name: {} if extra is True else extra for name in missing}
    return {**node, "properties": {**properties, **listed}}


def _check(node: Mapping[str, Any], path: str, out: Rewrite) -> None:
    for key in node:
        if key in REFUSED and not (key == "uniqueItems" and node[key] is False):
            raise SchemaError(key, path, "is not enforced by the grammar engine: refused")
    for key in ("$ref", "anyOf", "oneOf", "allOf"):
        if key in node:
            loud = sorted(k for k in node if k != key and k not in _QUIET)
            if loud:
                raise SchemaError(key, path, f"cannot have sibling keywords ({', '.join(loud)})")
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise SchemaError("$ref", path, f"must be a local reference (#/...), got {ref!r:.60}")
    if "allOf" in node and not (isinstance(node["allOf"], list) and len(node["allOf"]) == 1):
        raise SchemaError("allOf", path, "is supported with exactly one subschema")
    if "oneOf" in node and not disjoint(node["oneOf"], out.root):
        raise SchemaError("oneOf", path, "has branches that may both match: use anyOf")
    multiple = node.get("multipleOf")
    if multiple is not None and (
        node.get("type") != "integer" or not isinstance(multiple, int) or multiple <= 0
    ):
        raise SchemaError("multipleOf", path, "is supported on integers by a positive integer")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMATS and any(k in node for k in STRING_BOUNDS):
        raise SchemaError("format", path, "cannot be enforced together with a length or pattern")


def _bounded_string(node: Mapping[str, Any], path: str, out: Rewrite) -> Any:
    """A string node with minLength, maxLength or pattern (and no enum or const): a marker
    (anyOf the node's other types, where its type lists more)."""
    low = _length(node, "minLength", path) or 0
    high = _length(node, "maxLength", path)
    if high is not None and low > high:
        raise SchemaError("minLength", path, f"is greater than maxLength ({low} > {high})")
    pattern = node.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise SchemaError("pattern", path, "must be a string")
        try:
            re.compile(pattern)
        except re.error as e:
            raise SchemaError("pattern", path, f"is not a valid regular expression: {e}") from e
    types = node.get("type", "string")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or "string" not in types:
        return _walk({k: v for k, v in node.items() if k not in STRING_BOUNDS}, path, out)
    try:
        marked: Any = {"const": out.marker(low, high, pattern)}
    except PatternError as e:
        raise SchemaError("pattern", path, f"{pattern!r}: {e}") from e
    others = [t for t in types if t != "string"]
    if others:
        rest = {k: v for k, v in node.items() if k not in (*STRING_BOUNDS, "type")}
        marked = {"anyOf": [marked, _walk({**rest, "type": others}, path, out)]}
    return marked


def _length(node: Mapping[str, Any], key: str, path: str) -> int | None:
    value = node.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(key, path, f"must be a non-negative integer, got {value!r:.40}")
    return value


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
