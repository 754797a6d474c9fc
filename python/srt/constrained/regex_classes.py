"""The class escapes of a JSON Schema `pattern` (`\\d \\D \\w \\W \\s \\S`) in the two dialects
that meet there: ECMA-262, which JSON Schema names, and Python's `re`, which Python validators
match with. ECMA's `\\d` and `\\w` are ASCII, Python's Unicode; their `\\s` differ by a few
characters each way. A grammar that must satisfy both takes, for each escape, the characters
both match (and a negated class, the complement of those either matches).
"""

from __future__ import annotations

import functools
import re

from srt.constrained.json_chars import (
    MAX_CODE_POINT,
    SURROGATES,
    Ranges,
    complement,
    intersect,
    normalize,
)

ECMA_SPACE = normalize(
    [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ]
)
ECMA_DIGIT = normalize([(0x30, 0x39)])
# What Python's `re` matches with \s in a str pattern (`str.isspace`).
PYTHON_SPACE = normalize(
    [
        (0x09, 0x0D),
        (0x1C, 0x20),
        (0x85, 0x85),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
    ]
)
ASCII_WORD = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])


@functools.cache
def _python_set(escape: str) -> Ranges:
    """The code points Python's `re` matches with class escape `escape` (`\\d`, `\\w`, `\\s`),
    found in one pass over every code point (a few tenths of a second, once per process)."""
    gap = SURROGATES[1] - SURROGATES[0] + 1
    text = "".join(map(chr, range(SURROGATES[0]))) + "".join(
        map(chr, range(SURROGATES[1] + 1, MAX_CODE_POINT + 1))
    )
    ranges = []
    for match in re.finditer(escape + "+", text):
        lo, hi = match.start(), match.end() - 1
        shift = [0 if c < SURROGATES[0] else gap for c in (lo, hi)]
        ranges.append((lo + shift[0], hi + shift[1]))
    return normalize(ranges)


def class_escape(letter: str, negated_class: bool) -> tuple[Ranges, Ranges] | None:
    """(the characters both dialects match, the characters either matches) of `\\d`, `\\D`,
    `\\w`, `\\W`, `\\s`, `\\S`; None for another letter. The second is only needed (and only
    right) for an uppercase letter or inside a negated class: Python's `\\d` and `\\w` are
    found by a scan of every code point, made only then."""
    kind = letter.lower()
    if kind not in "dws":
        return None
    ecma = {"d": ECMA_DIGIT, "w": ASCII_WORD, "s": ECMA_SPACE}[kind]
    both = intersect(ecma, PYTHON_SPACE) if kind == "s" else ecma  # ECMA's \\d, \\w: ASCII
    either = both
    if letter.isupper() or negated_class:
        python = PYTHON_SPACE if kind == "s" else _python_set("\\" + kind)
        either = normalize(ecma + python)
    if letter.isupper():
        return complement(either), complement(both)
    return both, either
