"""A JSON Schema as an xgrammar grammar: xgrammar's own, but for the strings bounded by
`minLength`, `maxLength` or `pattern`, whose rules srt writes (`schema_rewrite`).

The marked schema goes through xgrammar's converter; each marker's literal in the EBNF it prints
(`"\\"<marker>\\""`, a `const` string) is replaced by the name of its string's rule, and the
rules are appended. A schema without bounded strings is left to `compile_json_schema` whole.
"""

from __future__ import annotations

import json
import re

import xgrammar as xgr

from srt.constrained.json_chars import SHARED_RULES
from srt.constrained.schema_rewrite import rewrite

_OWN_RULE = re.compile(r"^srt_", re.MULTILINE)


def schema_grammar(text: str, any_whitespace: bool) -> xgr.Grammar | None:
    """The grammar of JSON Schema `text`, or None where xgrammar's own is right (the schema
    bounds no string); SchemaError (a ValueError) for a schema srt refuses."""
    schema = json.loads(text)
    marked = rewrite(schema)
    if marked.schema == schema:
        return None
    converted = xgr.Grammar.from_json_schema(
        json.dumps(marked.schema), any_whitespace=any_whitespace
    )
    if not marked.rules:  # only enums filtered by their strings' bounds
        return converted
    ebnf = str(converted)
    if _OWN_RULE.search(ebnf):
        raise RuntimeError("xgrammar named a rule of its own srt_*")
    rules = []
    for marker, rule in marked.rules.items():
        literal, name = f'"\\"{marker}\\""', rule.split(" ", 1)[0]
        if literal not in ebnf:
            raise RuntimeError(f"xgrammar's grammar of the schema lost the marker of {name}")
        ebnf = ebnf.replace(literal, name)
        rules.append(rule)
    return xgr.Grammar.from_ebnf("\n".join([ebnf, *rules, SHARED_RULES]))
