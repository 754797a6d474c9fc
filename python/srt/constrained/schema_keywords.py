"""What srt does with each JSON Schema keyword in a `json_schema` (or a tool's parameters): the
coverage table README.md quotes, and tests/test_schema_coverage.py measures keyword by keyword.

- enforced: every output that ends with `stop` satisfies it (xgrammar's grammar, or srt's own
  for strings bounded by `minLength`, `maxLength` or `pattern`);
- annotation: it constrains nothing a validator checks (JSON Schema's annotations, and `format`
  names xgrammar does not know, which validators treat as annotations by default);
- refused: xgrammar 0.2.9 compiles it without enforcing it, so the request is refused with a
  400 naming it rather than answered with output that may violate it.
"""

from __future__ import annotations

ENFORCED: dict[str, str] = {
    "type": "one type or a list of types",
    "properties": "",
    "required": "a name properties lack is listed there under additionalProperties' schema "
    "(xgrammar leaves it out)",
    "additionalProperties": "absent means false: only the listed properties are written",
    "patternProperties": "keys matched whole (written without escapes)",
    "propertyNames": "",
    "minProperties": "",
    "maxProperties": "",
    "unevaluatedProperties": "",
    "items": "a schema; an array of schemas is refused (use prefixItems)",
    "prefixItems": "",
    "unevaluatedItems": "",
    "minItems": "",
    "maxItems": "",
    "enum": "xgrammar writes its values, ignoring what is beside it: they are filtered by "
    "type, minLength, maxLength, pattern, the numeric bounds and multipleOf there; any other "
    "keyword beside it is refused",
    "const": "as enum",
    "anyOf": "without sibling keywords other than annotations",
    "oneOf": "only where its branches cannot both match (distinct types or const values)",
    "allOf": "one subschema, without sibling keywords other than annotations",
    "$ref": "local references (#, #/$defs/..., #/definitions/...), without sibling keywords "
    "other than annotations and $defs",
    "$defs": "",
    "definitions": "",
    "minimum": "",
    "maximum": "",
    "exclusiveMinimum": "",
    "exclusiveMaximum": "",
    "multipleOf": "on integers, by a positive integer; refused on other numbers",
    "minLength": "counts decoded characters; any escape counts one",
    "maxLength": "counts decoded characters; any escape counts one",
    "pattern": "matched anywhere in the decoded value; lookaround, backreferences, word "
    "boundaries, inline flags, possessive quantifiers and {,n} are refused, and so is "
    "minLength/maxLength beside a pattern whose variable part is more than one repeated class",
    "format": "uuid, email, hostname, ipv6, uri, uri-reference, uri-template, duration; date, "
    "time, date-time and ipv4 by their shape (xgrammar's grammar lets Feb 30, a second 60 and "
    "leading zeros through); not together with minLength, maxLength or pattern",
}

ANNOTATIONS: dict[str, str] = {
    "title": "",
    "description": "",
    "default": "",
    "examples": "",
    "deprecated": "",
    "readOnly": "",
    "writeOnly": "",
    "$schema": "",
    "$id": "",
    "$comment": "",
    "contentEncoding": "",
    "contentMediaType": "",
    "discriminator": "OpenAPI's; the branches themselves are enforced",
    "format": "other names than the enforced ones",
}

REFUSED: dict[str, str] = {
    "uniqueItems": "true only; false is accepted",
    "contains": "",
    "minContains": "",
    "maxContains": "",
    "dependentRequired": "",
    "dependentSchemas": "",
    "dependencies": "",
    "not": "",
    "if": "with then and else",
    "then": "",
    "else": "",
    "$dynamicRef": "",
    "$recursiveRef": "",
}

# The `format` names xgrammar 0.2.9 compiles to a grammar of their own.
FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
    }
)
# Keywords that only a string's value is checked against: srt's own grammar writes those strings.
STRING_BOUNDS = ("minLength", "maxLength", "pattern")


class SchemaError(ValueError):
    """A schema srt refuses: `keyword` at `path` (a JSON Pointer) is the reason."""

    def __init__(self, keyword: str, path: str, why: str) -> None:
        super().__init__(f"{keyword} at {path or '/'} {why}")
        self.keyword = keyword
        self.path = path
