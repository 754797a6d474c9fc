"""OpenAI's tool fields in a chat body (`openai_tools`, `openai_messages`): tools checked (a 400
naming the field), `tool_choice` turned into a plan and, for `required` and a named function,
a JSON Schema whose grammar admits exactly the calls it should; tools and a conversation with
tool calls and results rendered by the chat template through the tokenizer manager."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr
from test_openai_protocol import LIMITS, MODEL, checked, refused
from xgrammar.testing import _is_grammar_accept_string

from srt.entrypoints.http.openai_protocol import OpenAIRequest, parse_chat_request
from srt.entrypoints.http.openai_tool_output import ToolCallStream, chat_message
from srt.managers.generate_req_input import expand
from srt.managers.request_tokenizer import RequestTokenizer
from srt.server_args import ServerArgs

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
NOW: dict[str, Any] = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, NOW]
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory: Callable[[str], Path]) -> RequestTokenizer:
    return RequestTokenizer(ServerArgs(model_path=str(tiny_model_factory("llama"))))


def chat(tokenizer: RequestTokenizer, parser: str | None = "hermes", **fields: Any) -> Any:
    body = {"model": MODEL, "messages": USER, **fields}
    return checked(tokenizer, parse_chat_request(body, MODEL, parser), LIMITS)


def prompt(tokenizer: RequestTokenizer, req: OpenAIRequest) -> str:
    (tokenized,) = tokenizer.tokenize(expand(req.obj, LIMITS))
    return tokenizer.tokenizer.decode(list(tokenized.input_ids))


def accepts(schema: str, text: str) -> bool:
    return bool(_is_grammar_accept_string(xgr.Grammar.from_json_schema(schema), text))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": []}, "tools"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": ["get_weather"]}, "tools[0]"),
        ({"tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
            "tools[0].function.name",
        ),
        ({"tools": [NOW, NOW]}, "tools[1].function.name"),
        (
            {"tools": [NOW, {"type": "function", "function": {"name": "g", "parameters": []}}]},
            "tools[1].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "g", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "g", "description": 3}}]},
            "tools[0].function",
        ),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "required", "regex": "a+"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[1]"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function",
        ),
    ],
)
def test_bad_tool_fields_are_400_naming_the_field(
    tokenizer: RequestTokenizer, fields: dict[str, Any], param: str
) -> None:
    refused(lambda: chat(tokenizer, **fields), param)


def test_auto_needs_a_parser_and_required_does_not(tokenizer: RequestTokenizer) -> None:
    error = refused(lambda: chat(tokenizer, None, tools=TOOLS), "tool_choice")
    assert "--tool-call-parser" in error.message
    assert chat(tokenizer, None, tools=TOOLS, tool_choice="required").tools.choice == "required"
    assert chat(tokenizer, None, tools=TOOLS, tool_choice="none").tools is None


def test_tool_choice_plans(tokenizer: RequestTokenizer) -> None:
    auto = chat(tokenizer, tools=TOOLS)
    assert (auto.tools.choice, auto.tools.format_name, auto.tools.parallel) == (
        "auto",
        "hermes",
        True,
    )
    assert "json_schema" not in auto.obj.sampling_params
    none = chat(tokenizer, tools=TOOLS, tool_choice="none")
    assert (none.tools, none.obj.tools) == (None, None)  # nor rendered
    named = chat(
        tokenizer,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert [t.name for t in named.tools.tools] == ["get_weather"]
    schema = named.obj.sampling_params["json_schema"]
    assert accepts(schema, '{"city": "Paris"}')
    assert not accepts(schema, '{"town": "Paris"}')
    assert named.json_schema_field == "tools"


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_a_grammar_of_calls_to_listed_tools(
    tokenizer: RequestTokenizer, parallel: bool
) -> None:
    req = chat(tokenizer, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    schema = req.obj.sampling_params["json_schema"]
    one = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
    two = (
        '[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}]'
    )
    assert accepts(schema, one)
    assert accepts(schema, two) == parallel
    for wrong in ("[]", '[{"name": "nope", "parameters": {}}]', '[{"name": "now"}]', "Sunny."):
        assert not accepts(schema, wrong), wrong


def test_tools_and_a_conversation_with_tool_results_render(tokenizer: RequestTokenizer) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    text = prompt(tokenizer, chat(tokenizer, tools=TOOLS, messages=messages))
    assert json.dumps(WEATHER) in text
    assert json.dumps(NOW) in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\nSunny, 21 C<|im_end|>" in text
    plain = prompt(tokenizer, chat(tokenizer, tools=TOOLS, tool_choice="none", messages=messages))
    assert "<tools>" not in plain
    assert "Sunny, 21 C" in plain


def test_required_lifts_each_tools_defs_to_the_root(tokenizer: RequestTokenizer) -> None:
    def tool(name: str, unit: list[str]) -> dict[str, Any]:
        parameters = {
            "type": "object",
            "properties": {"unit": {"$ref": "#/$defs/unit"}},
            "required": ["unit"],
            "$defs": {"unit": {"enum": unit}},
        }
        return {"type": "function", "function": {"name": name, "parameters": parameters}}

    req = chat(
        tokenizer, tools=[tool("a", ["c", "f"]), tool("b", ["c", "f"])], tool_choice="required"
    )
    schema = req.obj.sampling_params["json_schema"]
    assert accepts(schema, '[{"name": "b", "parameters": {"unit": "f"}}]')
    assert not accepts(schema, '[{"name": "b", "parameters": {"unit": "k"}}]')
    clash = [tool("a", ["c"]), tool("b", ["f"])]
    refused(lambda: chat(tokenizer, tools=clash, tool_choice="required"), "tools")


def test_answers_and_stream_deltas_in_openai_shape(tokenizer: RequestTokenizer) -> None:
    plan = chat(tokenizer, tools=TOOLS).tools
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    message, reason = chat_message(plan, text, "stop")
    assert (reason, message["content"]) == ("tool_calls", "Sure. ")
    (call,) = message["tool_calls"]
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert chat_message(plan, text, "length")[1] == "length"  # cut short: no "tool_calls"
    assert chat_message(plan, "No call.", "stop") == (
        {"role": "assistant", "content": "No call."},
        "stop",
    )
    stream = ToolCallStream(plan)
    first, _ = stream.delta(text[:40], None)
    assert first["content"] == "Sure. "
    (announce,) = first["tool_calls"]
    assert announce["function"]["name"] == "get_weather"
    assert set(announce) == {"index", "id", "type", "function"}
    last, reason = stream.delta(text[40:], "stop")
    assert reason == "tool_calls"
    assert "content" not in last
    assert [set(d) for d in last["tool_calls"]] == [{"index", "function"}]
    arguments = announce["function"]["arguments"] + last["tool_calls"][0]["function"]["arguments"]
    assert arguments == call["function"]["arguments"]
