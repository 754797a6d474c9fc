"""A JSON Schema `pattern` as a grammar over the decoded characters of a JSON string.

`pattern` is an ECMA-262 regular expression matched anywhere in the decoded value (a pattern
without `^` or `$` allows anything around its match); validators in Python match it with `re`.
Where the two dialects differ, each construct takes the characters both match (`\\d` is
`[0-9]`, `.` leaves out every line terminator), so output matches under either. A construct
whose language no grammar can hold exactly here (lookaround, backreferences, word boundaries,
inline flags, anchors inside the expression, possessive quantifiers, `{,n}`, Unicode property
classes) is refused: `PatternError` names it.

A decoded character is then spelled in every way JSON allows (`json_chars.char_expr`), so a
literal `"` in a pattern is written `\\"` and `a` may be written `\\u0061`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from srt.constrained.json_chars import ANY, Ranges, char_expr, complement, difference, normalize
from srt.constrained.regex_classes import class_escape


class PatternError(ValueError):
    """A `pattern` this module cannot turn into a grammar that holds exactly its language."""


@dataclass(frozen=True)
class Chars:
    chars: Ranges


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    node: Node
    low: int
    high: int | None  # None: unbounded


Node = Chars | Seq | Alt | Repeat

LINE_TERMINATORS = normalize([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
DOT = difference(ANY, LINE_TERMINATORS)
ANY_STRING = Repeat(Chars(ANY), 0, None)
_SIMPLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_REFUSED_ESCAPES = {
    "b": "the word boundary \\b",
    "B": "the word boundary \\B",
    "A": "the anchor \\A",
    "Z": "the anchor \\Z",
    "z": "the anchor \\z",
    "p": "the Unicode property class \\p",
    "P": "the Unicode property class \\P",
    "c": "the control escape \\c",
    "k": "the backreference \\k",
    "U": "the escape \\U",
    "N": "the escape \\N",
    "0": "the octal escape \\0",
}
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0

    def fail(self, construct: str) -> PatternError:
        return PatternError(f"{construct} (at offset {self.pos}) is not supported")

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.text[i] if i < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise self.fail("an unfinished expression")
        self.pos += 1
        return char

    def top(self) -> Node:
        """The whole pattern: each top-level branch allows any text where it has no anchor."""
        branches = []
        while True:
            start = self.peek() == "^"
            self.pos += start
            body = self.sequence()
            end = self.peek() == "$"
            self.pos += end
            if self.peek() not in ("", "|"):
                raise self.fail("an anchor inside the expression" if end else "an unmatched )")
            items = body.items if isinstance(body, Seq) else (body,)
            # Unanchored, any text may come first or last: a starred class there is part of it.
            if not start:
                items = (ANY_STRING, *items[_starred(items[:1]) :])
            if not end:
                items = (*items[: len(items) - _starred(items[-1:])], ANY_STRING)
            branches.append(Seq(items))
            if not self.peek():
                return branches[0] if len(branches) == 1 else Alt(tuple(branches))
            self.pos += 1

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            if self.peek() == "$" and self.peek(1) in ("", "|"):
                break  # the branch's end anchor, which `top` takes
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return Chars(self.char_class())
        if char == ".":
            return Chars(DOT)
        if char == "\\":
            return Chars(self.escape(in_class=False)[0])
        if char in "^$":
            raise self.fail("an anchor inside the expression")
        if char in "*+?" or (char == "{" and _QUANTIFIER.match(self.text, self.pos - 1)):
            raise self.fail("a quantifier with nothing to repeat")
        if char == "{" and self.peek() == ",":
            raise self.fail("the quantifier {,n}")
        if char == ")":
            raise self.fail("an unmatched )")
        return Chars(normalize([(ord(char), ord(char))]))

    def group(self) -> Node:
        if self.peek() == "?":
            head = self.text[self.pos : self.pos + 3]
            if head.startswith("?:"):
                self.pos += 2
            elif re.match(r"\?P?<[A-Za-z_]\w*>", self.text[self.pos :]):
                self.pos = self.text.index(">", self.pos) + 1
            elif head[:2] in ("?=", "?!") or head in ("?<=", "?<!"):
                raise self.fail("lookaround (?=, (?!, (?<=, (?<!")
            elif head.startswith("?P="):
                raise self.fail("the backreference (?P=")
            else:
                raise self.fail("the group (?" + head[1:2])
        node = self.alternation()
        if self.peek() == "$":
            raise self.fail("an anchor inside the expression")
        if self.take() != ")":
            raise self.fail("an unclosed (")
        return node

    def quantified(self, node: Node) -> Node:
        while True:
            char = self.peek()
            bounds: tuple[int, int | None]
            if char in ("*", "+", "?"):
                self.pos += 1
                bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            elif char == "{" and (match := _QUANTIFIER.match(self.text, self.pos)):
                self.pos = match.end()
                low = int(match.group(1))
                high = low if match.group(2) is None else int(match.group(3) or -1)
                bounds = (low, None if high == -1 else high)
                if bounds[1] is not None and bounds[1] < low:
                    raise self.fail("a quantifier {n,m} with m < n")
            elif char == "{" and self.peek(1) == ",":
                raise self.fail("the quantifier {,n}")
            else:
                return node
            if self.peek() == "+":
                raise self.fail("a possessive quantifier")
            self.pos += self.peek() == "?"  # lazy: the same language
            node = Repeat(node, *bounds)

    def char_class(self) -> Ranges:
        negated = self.peek() == "^"
        self.pos += negated
        if self.peek() == "]":
            raise self.fail("] first in a class")
        both: list[tuple[int, int]] = []
        either: list[tuple[int, int]] = []
        while (char := self.take()) != "]":
            if char == "\\":
                low, high = self.escape(in_class=True, negated_class=negated)
            elif char == "[" and self.peek() in (":", "=", "."):
                raise self.fail("a POSIX class [: in a class")
            else:
                low = high = normalize([(ord(char), ord(char))])
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                end = self.take()
                end_set = self.escape(in_class=True)[0] if end == "\\" else None
                single = end_set is None or (len(end_set) == 1 and end_set[0][0] == end_set[0][1])
                if len(low) != 1 or low[0][0] != low[0][1] or not single:
                    raise self.fail("a range whose end is a class")
                last = ord(end) if end_set is None else end_set[0][0]
                if last < low[0][0]:
                    raise self.fail("a range out of order")
                low = high = normalize([(low[0][0], last)])
            both += low
            either += high
        return complement(normalize(either)) if negated else normalize(both)

    def escape(self, in_class: bool, negated_class: bool = False) -> tuple[Ranges, Ranges]:
        """(the characters both dialects match, those either matches) of the escape after a
        backslash."""
        char = self.take()
        sets = class_escape(char, negated_class)
        if sets is not None:
            return sets
        code: int | None = None
        if char == "b" and in_class:
            code = 0x08
        elif char in _REFUSED_ESCAPES:
            raise self.fail(_REFUSED_ESCAPES[char])
        elif char in _SIMPLE_ESCAPES:
            code = _SIMPLE_ESCAPES[char]
        elif char in "xu":
            width = 2 if char == "x" else 4
            digits = self.text[self.pos : self.pos + width]
            if not re.fullmatch(f"[0-9a-fA-F]{{{width}}}", digits):
                raise self.fail(f"the escape \\{char} without {width} hex digits")
            self.pos += width
            code = int(digits, 16)
            if 0xD800 <= code <= 0xDFFF:
                raise self.fail("a surrogate escape")
        elif char.isdigit():
            raise self.fail("the backreference \\" + char)
        elif char.isalnum():
            raise self.fail("the escape \\" + char)
        else:
            code = ord(char)
        chars = normalize([(code, code)])
        return chars, chars


def parse(pattern: str) -> Node:
    """The language of `pattern` (the whole decoded value), or PatternError."""
    return _Parser(pattern).top()


def lengths(node: Node) -> tuple[int, int | None]:
    """The fewest and most characters of a string in `node`'s language (None: unbounded)."""
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Repeat):
        low, high = lengths(node.node)
        return low * node.low, None if high is None or node.high is None else high * node.high
    parts = [lengths(n) for n in (node.items if isinstance(node, Seq) else node.options)]
    highs = [h for _, h in parts]
    if isinstance(node, Seq):
        total = None if None in highs else sum(h for h in highs if h is not None)
        return sum(low for low, _ in parts), total
    if None in highs:
        return min(low for low, _ in parts), None
    return min(low for low, _ in parts), max(h for h in highs if h is not None)


def bounded(node: Node, min_length: int, max_length: int | None) -> Node:
    """`node`'s language cut to `min_length..max_length` characters: either it already lies
    within them, or it is a sequence whose only variable-length item repeats one character class
    (`^[a-z]+$`, `^[A-Z][a-z]*$`, an unanchored end); PatternError otherwise."""
    low, high = lengths(node)
    if low >= min_length and (max_length is None or (high is not None and high <= max_length)):
        return node
    items = node.items if isinstance(node, Seq) else (node,)
    variable = [i for i, item in enumerate(items) if len(set(lengths(item))) > 1]
    if len(variable) != 1 or not _repeats_chars(items[variable[0]]):
        raise PatternError(
            "together with minLength/maxLength it is supported only where its own lengths lie "
            "within them or one repeated character class makes up its variable part"
        )
    at = variable[0]
    repeat = items[at]
    assert isinstance(repeat, Repeat)
    fixed = sum(lengths(item)[0] for i, item in enumerate(items) if i != at)
    new_low = max(repeat.low, min_length - fixed)
    limits = [
        h
        for h in (repeat.high, None if max_length is None else max_length - fixed)
        if h is not None
    ]
    new_high = min(limits) if limits else None
    if new_high is not None and new_high < new_low:
        raise PatternError("no string of the allowed lengths matches it")
    return Seq((*items[:at], Repeat(repeat.node, new_low, new_high), *items[at + 1 :]))


def _starred(items: tuple[Node, ...]) -> bool:
    """Whether `items` is one starred character class (`.*`, `[a-z]*`)."""
    if len(items) != 1 or not isinstance(items[0], Repeat):
        return False
    return _repeats_chars(items[0]) and (items[0].low, items[0].high) == (0, None)


def _repeats_chars(node: Node) -> bool:
    return isinstance(node, Repeat) and isinstance(node.node, Chars)


def to_ebnf(node: Node) -> str:
    """An EBNF expression for the JSON spellings of `node`'s strings (without the quotes)."""
    if isinstance(node, Chars):
        expr = char_expr(node.chars)
        if expr is None:
            raise PatternError("an empty character class")
        return expr
    if isinstance(node, Repeat):
        if node.high == 0:
            return '""'
        high = "" if node.high is None else str(node.high)
        return f"({to_ebnf(node.node)}){{{node.low},{high}}}"
    if isinstance(node, Seq):
        return "(" + " ".join(to_ebnf(n) for n in node.items) + ")" if node.items else '""'
    return "(" + " | ".join(to_ebnf(n) for n in node.options) + ")"
