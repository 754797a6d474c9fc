"""`enum` and `const` as xgrammar 0.2.9 compiles them: it writes exactly their values and ignores
every keyword beside them (`{"type": "string", "enum": ["a", 1]}` lets `1` through). So the
values are filtered here by the keywords beside them that a value is checked against in Python
(`type`, `minLength`, `maxLength`, `pattern`, the numeric bounds, `multipleOf`); any other
keyword beside them but annotations is refused.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from srt.constrained.schema_keywords import SchemaError
from srt.constrained.schema_oneof import canonical

_CHECKED = frozenset(
    {
        "type",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)


def allowed_values(node: Mapping[str, Any], path: str, quiet: Collection[str]) -> list[Any]:
    """The values of `node`'s `enum` (or `const`) that satisfy the keywords beside it; keywords
    in `quiet` (annotations) are ignored. SchemaError for another keyword, or for no value."""
    keyword = "enum" if "enum" in node else "const"
    if keyword == "enum" and not isinstance(node["enum"], list):
        raise SchemaError("enum", path, "must be an array")
    values = node["enum"] if keyword == "enum" else [node["const"]]
    if "enum" in node and "const" in node:
        values = [v for v in values if canonical(v) == canonical(node["const"])]
    loud = sorted(k for k in node if k not in {*quiet, *_CHECKED, "enum", "const"})
    if loud:
        raise SchemaError(loud[0], path, f"beside {keyword} is not enforced: refused")
    kept = [v for v in values if _satisfies(v, node, path)]
    if not kept:
        raise SchemaError(keyword, path, "has no value that satisfies the keywords beside it")
    return kept


def _satisfies(value: Any, node: Mapping[str, Any], path: str) -> bool:
    types = node.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not any(_is(value, t) for t in types):
            return False
    if isinstance(value, str):
        return _fits_string(value, node, path)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _fits_number(value, node, path)
    return True


def _is(value: Any, kind: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    checks = {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "integer": number and float(value).is_integer(),
        "number": number,
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, Mapping),
    }
    return checks.get(kind, False) if isinstance(kind, str) else False


def _fits_string(value: str, node: Mapping[str, Any], path: str) -> bool:
    low, high, pattern = node.get("minLength", 0), node.get("maxLength"), node.get("pattern")
    for key, bound in (("minLength", low), ("maxLength", high)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise SchemaError(key, path, f"must be a non-negative integer, got {bound!r:.40}")
    if pattern is not None:
        try:
            found = re.search(pattern, value) is not None
        except (re.error, TypeError) as e:
            raise SchemaError("pattern", path, f"is not a valid regular expression: {e}") from e
        if not found:
            return False
    return low <= len(value) and (high is None or len(value) <= high)


def _fits_number(value: float, node: Mapping[str, Any], path: str) -> bool:
    bounds = {
        k: node[k] for k in _CHECKED - {"type", "minLength", "maxLength", "pattern"} if k in node
    }
    for key, bound in bounds.items():
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise SchemaError(key, path, f"must be a number, got {bound!r:.40}")
    multiple = bounds.get("multipleOf")
    return not (
        ("minimum" in bounds and value < bounds["minimum"])
        or ("maximum" in bounds and value > bounds["maximum"])
        or ("exclusiveMinimum" in bounds and value <= bounds["exclusiveMinimum"])
        or ("exclusiveMaximum" in bounds and value >= bounds["exclusiveMaximum"])
        or (multiple is not None and (multiple <= 0 or not (value / multiple).is_integer()))
    )
