"""When a `oneOf` is an `anyOf`: xgrammar 0.2.9 compiles `oneOf` as `anyOf`, so an output may
match two branches, which `oneOf` forbids. `disjoint` proves that no value matches two branches
from what each branch fixes: its types (`integer` lies inside `number`), its `const`/`enum`
values, or the `const`/`enum` values of a property every such object must have (a
discriminator, as Pydantic's tagged unions write). What it cannot prove is refused.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_MAX_REF_DEPTH = 16
_TYPE_OF = {bool: "boolean", int: "integer", float: "number", str: "string"}


@dataclass(frozen=True)
class _Branch:
    types: frozenset[str] | None  # None: any type
    values: frozenset[str] | None  # canonical JSON of each allowed value; None: any
    tags: Mapping[str, frozenset[str]]  # required property -> canonical JSON of its values


def disjoint(branches: Any, root: Any) -> bool:
    """Whether no JSON value matches two of `branches` (schemas whose `$ref`s point into
    `root`), as far as their types, values and required tags show."""
    if not isinstance(branches, list):
        return False
    described = [_describe(_resolve(b, root), root) for b in branches]
    return all(_apart(a, b) for a, b in itertools.combinations(described, 2))


def _resolve(node: Any, root: Any) -> Any:
    for _ in range(_MAX_REF_DEPTH):
        if not (isinstance(node, Mapping) and isinstance(node.get("$ref"), str)):
            return node
        target: Any = root
        for part in node["$ref"].removeprefix("#").split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, Mapping) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return None
        node = target
    return None


def canonical(value: Any) -> str:
    """`value` as JSON text that equal JSON values share (1.0 is 1, keys sorted)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _value_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "array"
    return _TYPE_OF.get(type(value), "number")


def _values(node: Mapping[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    enum = node.get("enum")
    return enum if isinstance(enum, list) else None


def _describe(node: Any, root: Any) -> _Branch:
    if not isinstance(node, Mapping):
        return _Branch(None, None, {})
    values = _values(node)
    types: frozenset[str] | None = None
    if isinstance(node.get("type"), str):
        types = frozenset([node["type"]])
    elif isinstance(node.get("type"), list):
        types = frozenset(t for t in node["type"] if isinstance(t, str))
    if values is not None:
        value_types = frozenset(_value_type(v) for v in values)
        types = value_types if types is None else types & _widen(value_types)
    tags: dict[str, frozenset[str]] = {}
    required = node.get("required")
    properties = node.get("properties")
    if isinstance(required, Sequence) and isinstance(properties, Mapping):
        for name in required:
            tag = _resolve(properties.get(name), root) if isinstance(name, str) else None
            tag_values = _values(tag) if isinstance(tag, Mapping) else None
            if tag_values is not None:
                tags[name] = frozenset(canonical(v) for v in tag_values)
    canonical = None if values is None else frozenset(canonical(v) for v in values)
    return _Branch(types, canonical, tags)


def _widen(types: frozenset[str]) -> frozenset[str]:
    """`types` with `number` added beside `integer` and the other way round: they overlap."""
    return types | ({"number", "integer"} if types & {"number", "integer"} else frozenset())


def _apart(a: _Branch, b: _Branch) -> bool:
    if a.types is not None and b.types is not None and not (_widen(a.types) & b.types):
        return True
    if a.values is not None and b.values is not None and not (a.values & b.values):
        return True
    # Tags part objects only: a value of another type matches both unless one is all objects.
    if frozenset({"object"}) not in (a.types, b.types):
        return False
    return any(name in b.tags and not (a.tags[name] & b.tags[name]) for name in a.tags)
