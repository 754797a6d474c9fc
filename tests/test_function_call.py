"""Tool-call parsers (`srt.function_call`) against the outputs they must read: whole outputs
(complete calls, several, text around them, malformed blocks, unknown tools, cut-off output)
and the same outputs streamed in chunks split anywhere, which must add up to the whole parse
(hypothesis picks the split points)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srt.function_call.base_parser import ToolCallParser
from srt.function_call.core_types import ParsedOutput, Tool, merge
from srt.function_call.hermes import HermesParser
from srt.function_call.json_array import JsonArrayParser, NamedCallParser
from srt.function_call.json_scan import JsonSyntaxError, scan_object
from srt.function_call.llama3 import Llama3Parser

TOOLS = [Tool("get_weather"), Tool("add"), Tool("no_args")]
Calls = list[tuple[str, dict[str, object]]]

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
ADD = '{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "}\\" <tool_call>"}]}}'

# (text, content, calls) that every split of the text must give too.
HERMES_CASES: list[tuple[str, str, Calls]] = [
    (
        f"<tool_call>\n{WEATHER}\n</tool_call>",
        "",
        [("get_weather", {"city": "Paris", "unit": "c"})],
    ),
    (
        f"Let me check.\n<tool_call>{WEATHER}</tool_call>\n<tool_call>{ADD}</tool_call> Done.",
        "Let me check.\n\n Done.",
        [
            ("get_weather", {"city": "Paris", "unit": "c"}),
            ("add", {"a": 1, "b": [2, {"c": '}" <tool_call>'}]}),
        ],
    ),
    ("a < b, <tool_ is no tag, 1 </tool_call> 2", "a < b, <tool_ is no tag, 1 </tool_call> 2", []),
    ('<tool_call>{"name": "no_args"}</tool_call>', "", [("no_args", {})]),
    # arguments as JSON text, as some models write them
    (
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>',
        "",
        [("add", {"a": 1})],
    ),
    # malformed blocks stay text, and the next call still counts (as call 0)
    (
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": add}</tool_call>'
        f"<tool_call>{WEATHER}</tool_call>",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": add}</tool_call>',
        [("get_weather", {"city": "Paris", "unit": "c"})],
    ),
    # a missing end tag at the end of the output is forgiven; text after a call in its block
    # is content
    (f"<tool_call>{WEATHER}", "", [("get_weather", {"city": "Paris", "unit": "c"})]),
    (
        f"<tool_call>{WEATHER} oops</tool_call>",
        " oops",
        [("get_weather", {"city": "Paris", "unit": "c"})],
    ),
    ('<tool_call>{"arguments": {"a": 2}, "name": "add"}</tool_call>', "", [("add", {"a": 2})]),
]

LLAMA = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA3_CASES: list[tuple[str, str, Calls]] = [
    (LLAMA, "", [("get_weather", {"city": "Paris"})]),
    (f"<|python_tag|>{LLAMA}", "", [("get_weather", {"city": "Paris"})]),
    (
        f'  {LLAMA}; {{"name": "add", "parameters": {{"a": 1}}}}\nDone.',
        "Done.",
        [("get_weather", {"city": "Paris"}), ("add", {"a": 1})],
    ),
    (
        f"I will call it. <|python_tag|>{LLAMA}",
        "I will call it. ",
        [("get_weather", {"city": "Paris"})],
    ),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
    ("Plain {text} with braces.", "Plain {text} with braces.", []),
    ("<|python", "<|python", []),
]

ARRAY_CASES: list[tuple[str, str, Calls]] = [
    ('[{"name": "add", "parameters": {"a": 1}}]', "", [("add", {"a": 1})]),
    (
        '[{"name": "add", "parameters": {"a": 1}}, {"name": "no_args", "parameters": {}}]',
        "",
        [("add", {"a": 1}), ("no_args", {})],
    ),
    ('[{"name": "add", "parameters": {"a": 1}}] and more', "and more", [("add", {"a": 1})]),
]
# Cut short by max_tokens: a whole output's unfinished call is text (a stream has announced it).
CUT = '[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "parameters": {"ci'


def whole(parser: ToolCallParser, text: str) -> tuple[str, Calls]:
    return summary(parser.parse(text))


def summary(parsed: ParsedOutput) -> tuple[str, Calls]:
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def streamed(parser: ToolCallParser, text: str, cuts: Sequence[int]) -> ParsedOutput:
    deltas, start = [], 0
    for cut in [*sorted(cuts), len(text)]:
        deltas.append(parser.feed(text[start:cut]))
        start = max(start, cut)
    deltas.append(parser.finish())
    for delta in deltas:  # each call's first delta names it; later ones only add arguments
        for call in delta.calls:
            assert (call.id is None) == (call.name is None)
    return merge(deltas)


CASES = [
    *((HermesParser, *case) for case in HERMES_CASES),
    *((Llama3Parser, *case) for case in LLAMA3_CASES),
    *((JsonArrayParser, *case) for case in ARRAY_CASES),
]


@pytest.mark.parametrize(("kind", "text", "content", "calls"), CASES)
def test_whole_outputs(kind: type[ToolCallParser], text: str, content: str, calls: Calls) -> None:
    assert whole(kind(TOOLS), text) == (content, calls)
    parsed = kind(TOOLS).parse(text)
    assert all(c.id.startswith("call_") for c in parsed.calls)
    assert len({c.id for c in parsed.calls}) == len(parsed.calls)


@pytest.mark.parametrize(("kind", "text", "content", "calls"), CASES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_streams_split_anywhere_add_up_to_the_whole(
    kind: type[ToolCallParser], text: str, content: str, calls: Calls, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parser = kind(TOOLS, eager=True)
    got = streamed(parser, text, cuts)
    assert summary(got) == (content, calls)
    assert parser.called == bool(calls)


def test_an_output_cut_short() -> None:
    cut = '{"name": "get_weather", "parameters": {"ci'
    assert whole(JsonArrayParser(TOOLS), CUT) == (cut, [("add", {"a": 1})])
    got = streamed(JsonArrayParser(TOOLS, eager=True), CUT, [10, 50])
    assert [(c.name, c.arguments) for c in got.calls] == [
        ("add", '{"a": 1}'),
        ("get_weather", '{"ci'),
    ]
    assert got.content == ""


def test_a_stream_announces_a_call_by_name_before_its_arguments() -> None:
    parser = HermesParser(TOOLS, eager=True)
    first = parser.feed('Hi <tool_call>{"name": "get_weather", "argu')
    assert first.content == "Hi "
    (announce,) = first.calls
    assert (announce.index, announce.name, announce.arguments) == (0, "get_weather", "")
    assert announce.id is not None
    assert announce.id.startswith("call_")
    second = parser.feed('ments": {"city": "Pa')
    assert [(c.id, c.arguments) for c in second.calls] == [(None, '{"city": "Pa')]
    third = parser.feed('ris"}}</tool_call> <tool')  # a tag that may be starting is held back
    assert [c.arguments for c in third.calls] == ['ris"}']
    assert third.content == " "
    assert parser.finish().content == "<tool"


def test_a_stream_ends_a_call_that_breaks_after_its_announcement() -> None:
    parser = HermesParser(TOOLS, eager=True)
    parser.feed('<tool_call>{"name": "add", "arguments": {"a": 1')
    broken = parser.feed("]}</tool_call>after")
    assert broken.calls == []
    assert broken.content == "after"  # the rest of the broken block is dropped
    assert parser.called


def test_named_choice_output_is_the_arguments() -> None:
    tool = [Tool("add")]
    assert summary(NamedCallParser(tool).parse('{"a": 1}')) == ("", [("add", {"a": 1})])
    assert summary(NamedCallParser(tool).parse('{"a": ')) == ('{"a": ', [])
    parser = NamedCallParser(tool, eager=True)
    first, second = parser.feed('{"a"'), parser.feed(": 1}")
    assert (first.calls[0].name, first.calls[0].arguments) == ("add", '{"a"')
    assert (second.calls[0].id, second.calls[0].arguments) == (None, ": 1}")
    assert parser.finish().calls == []
    assert parser.called


def test_scan_object_reads_members_as_they_complete() -> None:
    text = '{"name": "f", "arguments": {"x": [1, "]"'
    obj = scan_object(text)
    assert obj.members == {"name": (9, 12)}
    assert obj.open == ("arguments", text.index("{", 1))
    assert obj.end is None
    done = scan_object('{"a": true} tail')
    assert done.end == len('{"a": true}')
    for bad in ('["a"]', '{"a" 1}', '{"a": tru}', '{"a": [1}', '{"a": 1 "b"}', "{a: 1}"):
        with pytest.raises(JsonSyntaxError):
            scan_object(bad)
