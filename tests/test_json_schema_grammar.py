"""srt's grammar of JSON strings bounded by minLength, maxLength or pattern, matched against
the languages they stand for: every spelling strict JSON allows of every decoded value that
satisfies the bounds is accepted (an escape counting one character), and everything accepted
parses with `json.loads` (strict) to a value that satisfies them. Driven through the grammar
backend's own compile path, as the scheduler's requests are.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srt.constrained import regex_classes
from srt.constrained.json_chars import MUST_ESCAPE, SHORT_ESCAPES, contains
from srt.constrained.schema_rewrite import SchemaError, rewrite
from srt.constrained.xgrammar_backend import GrammarBackend

SPELLINGS = ("raw", "short", "lower", "upper")
PATTERNS = [
    r"^[a-z]{2,5}$",
    r'^say "[A-Z][a-z]*"\\$',
    r"^\d{3}-\d{2}$",
    r"^(cat|dog)s?( \w+)?$",
    r"^[^a-c ]{1,3}\.$",
    r"^\S+@\S+$",
    r"^.x.$",
    r"b[\u00e9\n\t]",
    r"^[\x00-\x1f]{2}$",
    r"^[😀-🙏]$",
    r"end$",
]
# Classes past MAX_ESCAPE_BLOCKS `\\uXXXX` alternatives: only what JSON cannot hold raw is
# escaped.
LARGE_CLASS_PATTERNS = [r"^\D\W$", r"^[^\d]\W?$"]


@pytest.fixture(scope="module")
def backend(tiny_model_factory: Callable[[str], Path]) -> GrammarBackend:
    model = tiny_model_factory("llama")
    config = json.loads((model / "config.json").read_text())
    return GrammarBackend(str(model), config["vocab_size"], [config["eos_token_id"]])


def accepts(backend: GrammarBackend, schema: dict[str, Any], text: str) -> bool:
    """Whether the grammar of `schema` takes `text` whole (and then its end)."""
    key = json.dumps(schema)
    deadline = time.monotonic() + 30
    while not (status := backend.status("json_schema", key)).ready:
        assert status.error is None, status.error
        assert time.monotonic() < deadline
        time.sleep(0.002)
    matcher = backend.matcher("json_schema", key)
    return bool(matcher.accept_string(text)) and matcher.accept_token(backend.stop_token_ids[0])


def spell(value: str, choices: list[str], escape_all: bool = True) -> str:
    """`value` as a JSON string, character i spelled as `choices[i]` says where JSON allows it
    (without `escape_all`, `\\uXXXX` only where JSON must escape)."""
    out = []
    for char, how in zip(value, choices, strict=True):
        code = ord(char)
        if not escape_all and not contains(MUST_ESCAPE, code):
            how = "raw" if how != "short" else how
        if how == "short" and code in SHORT_ESCAPES:
            out.append("\\" + SHORT_ESCAPES[code])
        elif how in ("lower", "upper") or contains(MUST_ESCAPE, code):
            units = [code] if code <= 0xFFFF else _surrogates(code)
            text = "".join(f"\\u{u:04x}" for u in units)
            out.append(text.upper().replace("\\U", "\\u") if how == "upper" else text)
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _surrogates(code: int) -> list[int]:
    code -= 0x10000
    return [0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)]


def spelled(
    values: st.SearchStrategy[str], escape_all: bool = True
) -> st.SearchStrategy[tuple[str, str]]:
    """(a decoded value, one of its JSON spellings)."""
    return values.flatmap(
        lambda v: st.lists(st.sampled_from(SPELLINGS), min_size=len(v), max_size=len(v)).map(
            lambda choices: (v, spell(v, choices, escape_all))
        )
    )


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(case=spelled(TEXT), low=st.integers(0, 4), span=st.none() | st.integers(0, 4))
def test_a_bounded_string_takes_every_spelling_of_exactly_the_lengths_allowed(
    backend: GrammarBackend, case: tuple[str, str], low: int, span: int | None
) -> None:
    value, text = case
    high = None if span is None else low + span
    schema: dict[str, Any] = {"type": "string", "minLength": low}
    if high is not None:
        schema["maxLength"] = high
    assert json.loads(text) == value
    fits = low <= len(value) and (high is None or len(value) <= high)
    assert accepts(backend, schema, text) == fits, (value, text)


@pytest.mark.parametrize(
    "text",
    ['"a\x01"', '"\t"', '"a"b"', '"\\"', '"\\x41"', '"\\ud800"', '"\\udc00\\ud800"', '"\\u12"'],
)
def test_a_bounded_string_refuses_what_strict_json_refuses(
    backend: GrammarBackend, text: str
) -> None:
    assert not accepts(backend, {"type": "string", "maxLength": 5}, text)


@SETTINGS
@given(data=st.data(), pattern=st.sampled_from(PATTERNS + LARGE_CLASS_PATTERNS))
def test_a_pattern_takes_the_spellings_of_its_matches_and_only_matches(
    backend: GrammarBackend, data: st.DataObject, pattern: str
) -> None:
    schema = {"type": "string", "pattern": pattern}
    matches = st.from_regex(pattern).filter(lambda v: not re.search("[\ud800-\udfff]", v))
    value, text = data.draw(spelled(matches, pattern not in LARGE_CLASS_PATTERNS))
    if _common_dialect(value, pattern):
        assert accepts(backend, schema, text), (value, text)
    other, other_text = data.draw(spelled(TEXT))
    if accepts(backend, schema, other_text):
        assert re.search(pattern, json.loads(other_text)), other_text
        assert _common_dialect(other, pattern)


def _common_dialect(value: str, pattern: str) -> bool:
    """Whether `value` matches `pattern` where Python's and ECMA's classes agree (ASCII digits
    and word characters, no line terminator for `.`; Python's \\D and \\W, and its negated
    classes of \\d, are already the common ones) and `$` is the end (Python's also matches
    before a last newline)."""
    ecma = pattern
    if pattern not in LARGE_CLASS_PATTERNS:
        ecma = ecma.replace(r"\d", "[0-9]").replace(r"\w", "[A-Za-z0-9_]")
        ecma = ecma.replace(r"\S", r"[^\s\ufeff]")
        ecma = re.sub(r"(?<!\\)\.", "[^\n\r\u2028\u2029]", ecma)
    ecma = re.sub(r"\$$", r"\\Z", ecma)
    return re.search(ecma, value) is not None


def test_a_pattern_with_bounds_is_cut_to_them(backend: GrammarBackend) -> None:
    schema = {"type": "string", "pattern": "^[A-Z][a-z]*$", "minLength": 2, "maxLength": 3}
    assert accepts(backend, schema, '"Ab"')
    assert accepts(backend, schema, '"\\u0041bc"')
    assert not accepts(backend, schema, '"A"')
    assert not accepts(backend, schema, '"Abcd"')
    unanchored = {"type": "string", "pattern": "^x", "maxLength": 2}
    assert accepts(backend, unanchored, '"x\\n"')
    assert not accepts(backend, unanchored, '"x\\n\\n"')


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        ("a(?=b)", "lookaround"),
        ("(?<!a)b", "lookaround"),
        (r"(a)\1", "backreference"),
        (r"\bword", "word boundary"),
        ("(?i)abc", "group (?i"),
        ("a^b", "anchor"),
        ("a$b", "anchor"),
        ("a*+", "possessive"),
        ("a{,3}", "{,n}"),
        (r"[]a]", "] first"),
        (r"\p{L}", "\\p"),  # Python's re refuses it too
    ],
)
def test_a_pattern_no_grammar_holds_exactly_is_refused_naming_the_construct(
    pattern: str, construct: str
) -> None:
    with pytest.raises(SchemaError) as info:
        rewrite({"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}}})
    assert info.value.keyword == "pattern"
    assert info.value.path == "/properties/p"
    assert construct in str(info.value)


def test_a_pattern_whose_length_cannot_be_cut_is_refused() -> None:
    with pytest.raises(SchemaError, match=r"pattern at / .*minLength/maxLength"):
        rewrite({"type": "string", "pattern": "^a+b+$", "maxLength": 4})
    with pytest.raises(SchemaError, match="no string of the allowed lengths"):
        rewrite({"type": "string", "pattern": "^abc[0-9]*$", "maxLength": 2})


def test_the_whitespace_class_is_pythons() -> None:
    python = {c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and chr(c).isspace()}
    assert {c for lo, hi in regex_classes.PYTHON_SPACE for c in range(lo, hi + 1)} == python


def test_a_schema_without_bounded_strings_is_xgrammars_alone() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "n": {"enum": [1, 2]}}}
    marked = rewrite(schema)
    assert marked.schema == schema
    assert not marked.rules


def test_enum_values_are_filtered_by_the_string_bounds(backend: GrammarBackend) -> None:
    schema = {"enum": ["ab", "abcd", 7, "x\ny"], "maxLength": 3, "pattern": "^[a-z]+$"}
    assert accepts(backend, schema, '"ab"')
    assert accepts(backend, schema, "7")
    assert not accepts(backend, schema, '"abcd"')
    assert not accepts(backend, schema, '"x\\ny"')
    with pytest.raises(SchemaError, match="enum at / has no value that satisfies"):
        rewrite({"enum": ["abcd"], "maxLength": 3})
