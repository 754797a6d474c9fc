"""The characters of a JSON string (RFC 8259 §7) as grammar text: sets of code points, and the
EBNF that spells one decoded character of a set in every way strict JSON allows.

A decoded character c is written raw (any code point but U+0000-U+001F, `"` and `\\`), as a
short escape (`\\" \\\\ \\/ \\b \\f \\n \\r \\t`), or as `\\uXXXX` (hex digits of either case);
a code point past U+FFFF as the escaped surrogate pair. Each spelling is one character of the
decoded value, which is what JSON Schema's `minLength`/`maxLength` count. A lone surrogate
escape is never written: strict parsers (serde_json among them) refuse it; nor is a surrogate's
three UTF-8 bytes raw (xgrammar's classes take them), which decode to three U+FFFD.

The rules this module's expressions use (`SHARED_RULES`) are named `srt_json_*`: xgrammar names
the rules it builds from a schema `root*`, `basic_*` and `defs_*`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
# How many `\uXXXX` alternatives a set's escapes may take; a set that needs more (a negated
# class of hundreds of ranges) has only its characters that JSON cannot write raw escaped.
MAX_ESCAPE_BLOCKS = 48

Ranges = tuple[tuple[int, int], ...]
"""A set of code points: sorted, disjoint, non-adjacent inclusive ranges."""

ANY: Ranges = ((0, SURROGATES[0] - 1), (SURROGATES[1] + 1, MAX_CODE_POINT))
# What JSON cannot hold raw: the control characters, the quotation mark and the reverse solidus.
MUST_ESCAPE: Ranges = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
SHORT_ESCAPES = {
    0x22: '"',
    0x5C: "\\",
    0x2F: "/",
    0x08: "b",
    0x0C: "f",
    0x0A: "n",
    0x0D: "r",
    0x09: "t",
}

SHARED_RULES = r"""srt_json_hex ::= [0-9a-fA-F]
srt_json_char ::= [^\x00-\x1f"\\\ud800-\udfff] | "\\" srt_json_escape
srt_json_escape ::= ["\\/bfnrt] | "u" srt_json_unicode
srt_json_unicode ::= [0-9a-cA-CefEF] srt_json_hex{3} | [dD] [0-7] srt_json_hex{2}
    | [dD] [89abAB] srt_json_hex{2} "\\u" [dD] [c-fC-F] srt_json_hex{2}
"""
"""`srt_json_char`: any one decoded character, in any of its spellings."""
ANY_CHAR = "srt_json_char"


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """The set holding the code points of `ranges`, surrogates left out (no string holds one)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        for a, b in _without_surrogates(lo, hi):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
    return tuple(merged)


def _without_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    parts = [(lo, min(hi, SURROGATES[0] - 1)), (max(lo, SURROGATES[1] + 1), hi)]
    return [(a, b) for a, b in parts if a <= b]


def complement(ranges: Ranges) -> Ranges:
    return difference(ANY, ranges)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            if max(lo1, lo2) <= min(hi1, hi2):
                out.append((max(lo1, lo2), min(hi1, hi2)))
    return normalize(out)


def difference(a: Ranges, b: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in a:
        start = lo
        for blo, bhi in b:
            if bhi < start or blo > hi:
                continue
            if blo > start:
                out.append((start, blo - 1))
            start = bhi + 1
        if start <= hi:
            out.append((start, hi))
    return normalize(out)


def char_expr(chars: Ranges) -> str | None:
    """EBNF for one decoded character of `chars` in each of its spellings (its `\\uXXXX` ones
    only for the characters that need them when there would be more than `MAX_ESCAPE_BLOCKS`
    alternatives); None for the empty set."""
    if chars == ANY:
        return ANY_CHAR
    options = []
    raw = difference(chars, MUST_ESCAPE)
    if raw:
        options.append(char_class(raw))
    short = [SHORT_ESCAPES[c] for c in sorted(SHORT_ESCAPES) if contains(chars, c)]
    if short:
        options.append('"\\\\" ' + char_class(normalize((ord(c), ord(c)) for c in short)))
    unicode = _unicode_escapes(chars)
    if unicode is None:
        unicode = _unicode_escapes(intersect(chars, MUST_ESCAPE))
        assert unicode is not None, "a few ranges below U+0080"
    options.extend(unicode)
    if not options:
        return None
    return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"


def contains(chars: Ranges, code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in chars)


def _unicode_escapes(chars: Ranges) -> list[str] | None:
    """`\\uXXXX` spellings of `chars` (surrogate pairs past U+FFFF), or None past the limit."""
    options: list[str] = []
    for lo, hi in chars:
        if lo <= 0xFFFF:
            options += ['"\\\\u" ' + _hex(block) for block in _blocks(lo, min(hi, 0xFFFF), 4)]
        if hi > 0xFFFF:
            options += _pairs(max(lo, 0x10000), hi)
        if len(options) > MAX_ESCAPE_BLOCKS:
            return None
    return options


def _pairs(lo: int, hi: int) -> list[str]:
    """Escaped surrogate pairs of code points `lo..hi` (all past U+FFFF): a partial first and
    last high surrogate, and the full ones between."""
    high_lo, low_lo = divmod(lo - 0x10000, 0x400)
    high_hi, low_hi = divmod(hi - 0x10000, 0x400)
    if high_lo == high_hi:
        return [_pair(high_lo, high_lo, low_lo, low_hi)]
    out = []
    if low_lo:
        out.append(_pair(high_lo, high_lo, low_lo, 0x3FF))
        high_lo += 1
    tail = []
    if low_hi != 0x3FF:
        tail.append(_pair(high_hi, high_hi, 0, low_hi))
        high_hi -= 1
    if high_lo <= high_hi:
        out.append(_pair(high_lo, high_hi, 0, 0x3FF))
    return out + tail


def _pair(high_lo: int, high_hi: int, low_lo: int, low_hi: int) -> str:
    highs = " | ".join(_hex(b) for b in _blocks(0xD800 + high_lo, 0xD800 + high_hi, 4))
    lows = " | ".join(_hex(b) for b in _blocks(0xDC00 + low_lo, 0xDC00 + low_hi, 4))
    return f'"\\\\u" ({highs}) "\\\\u" ({lows})'


def _blocks(lo: int, hi: int, width: int) -> list[list[tuple[int, int]]]:
    """`lo..hi` as blocks of `width` hex digits, each a (low, high) range per digit."""
    if width == 0:
        return [[]]
    unit = 16 ** (width - 1)
    lo_digit, hi_digit = lo // unit, hi // unit
    if lo_digit == hi_digit:
        return [[(lo_digit, lo_digit), *rest] for rest in _blocks(lo % unit, hi % unit, width - 1)]
    head: list[list[tuple[int, int]]] = []
    tail: list[list[tuple[int, int]]] = []
    first, last = lo_digit, hi_digit
    if lo % unit:
        head = [[(lo_digit, lo_digit), *r] for r in _blocks(lo % unit, unit - 1, width - 1)]
        first += 1
    if hi % unit != unit - 1:
        tail = [[(hi_digit, hi_digit), *r] for r in _blocks(0, hi % unit, width - 1)]
        last -= 1
    middle = [[(first, last)] + [(0, 15)] * (width - 1)] if first <= last else []
    return head + middle + tail


def _hex(block: Sequence[tuple[int, int]]) -> str:
    return " ".join(_hex_digit(lo, hi) for lo, hi in block)


def _hex_digit(lo: int, hi: int) -> str:
    """A class of the hex digits `lo..hi`, letters in either case."""
    if (lo, hi) == (0, 15):
        return "srt_json_hex"
    digits = [(lo, min(hi, 9))] if lo <= 9 else []
    letters = (max(lo, 10), hi) if hi >= 10 else None
    parts = [_span(f"{a:x}", f"{b:x}") for a, b in digits]
    if letters is not None:
        a, b = letters
        parts += [_span(f"{a:x}", f"{b:x}"), _span(f"{a:X}", f"{b:X}")]
    return "[" + "".join(parts) + "]"


def _span(a: str, b: str) -> str:
    return a if a == b else f"{a}-{b}"


def char_class(chars: Ranges) -> str:
    """An EBNF character class of `chars` (code points, written as escapes unless alphanumeric
    ASCII)."""
    return "[" + "".join(_span(_class_char(lo), _class_char(hi)) for lo, hi in chars) + "]"


def _class_char(code: int) -> str:
    if code < 0x80 and chr(code).isalnum():
        return chr(code)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def string_rule(name: str, min_length: int, max_length: int | None) -> str:
    """The rule `name`: a JSON string of `min_length` to `max_length` (None: any number of)
    decoded characters."""
    upper = "" if max_length is None else str(max_length)
    return f'{name} ::= "\\"" {ANY_CHAR}{{{min_length},{upper}}} "\\""'
