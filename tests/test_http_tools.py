"""Tool calls through the official `openai` client against real `srt-serve`s on the tiny
random model: with `tool_choice` `required` or a named function, every output is a well-formed
call to a listed tool whose arguments validate against its parameters (`jsonschema`), for
several seeds and temperatures, streamed and not; `none` answers text; `auto` parses the
model's own Hermes calls (forced here with an `ebnf` grammar: random weights write none);
bad tools are 400s naming the field; a conversation carrying tool results renders."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from conftest import TINY_SERVER_MODEL

from srt.testing.server_process import ServerProcess, running_server

pytestmark = pytest.mark.slow

MODEL = TINY_SERVER_MODEL
# Bounded parameters: every path ends within MAX_TOKENS (a city of 8 characters, each escape
# `\uXXXX` one of them, is at most 48 characters of output; the quotation marks around its
# letters only escapes can write).
PARAMETERS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": '^"[a-z]+"$'},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "add": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999},
            "b": {"type": "integer", "minimum": 0, "maximum": 999},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "now": {"type": "object", "properties": {}, "additionalProperties": False},
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool.", "parameters": p},
    }
    for name, p in PARAMETERS.items()
]
MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hermes_client(tiny_model_factory: Callable[[str], Path]) -> Iterator[openai.OpenAI]:
    """A server that reads the model's own calls in Hermes' format (`tool_choice` auto)."""
    flags = ["--served-model-name", MODEL, "--tool-call-parser", "hermes"]
    with running_server(tiny_model_factory("llama"), *flags) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def valid_call(name: str, arguments: str) -> None:
    assert name in PARAMETERS, name
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def streamed_calls(chunks: Any) -> tuple[str, list[tuple[str, str, str]], str | None]:
    """(content, [(id, name, arguments)], finish reason) of a streamed choice, checking that
    each call's first delta names it and later ones only add arguments."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id is not None
                assert delta.function is not None
                assert delta.function.name is not None
                calls[delta.index] = [delta.id, delta.function.name, delta.function.arguments or ""]
            else:
                assert delta.id is None
                assert delta.function is not None
                calls[delta.index][2] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    assert sorted(calls) == list(range(len(calls)))
    return content, [(calls[i][0], calls[i][1], calls[i][2]) for i in sorted(calls)], finish


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_required_always_calls_a_listed_tool(client: openai.OpenAI, temperature: float) -> None:
    for seed in (1, 2, 3):
        request: Any = {
            "model": MODEL,
            "messages": MESSAGES,
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": MAX_TOKENS,
            "temperature": temperature,
            "seed": seed,
        }
        answer = client.chat.completions.create(**request, n=2)
        for choice in answer.choices:
            assert choice.finish_reason == "tool_calls"
            assert choice.message.content is None
            (call,) = choice.message.tool_calls or []
            assert call.type == "function"
            assert call.id.startswith("call_")
            valid_call(call.function.name, call.function.arguments)
        content, calls, finish = streamed_calls(
            client.chat.completions.create(**request, stream=True)
        )
        assert (content, finish, len(calls)) == ("", "tool_calls", 1)
        valid_call(calls[0][1], calls[0][2])


def test_required_with_parallel_calls(client: openai.OpenAI) -> None:
    """Any number of calls: an output either closes its array (every call valid) or runs out
    of tokens (finish reason length)."""
    answer = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,
        temperature=1.0,
        seed=5,
        n=6,
    )
    finished = [c for c in answer.choices if c.finish_reason == "tool_calls"]
    assert finished, [c.message for c in answer.choices]
    for choice in answer.choices:
        assert choice.finish_reason in ("tool_calls", "length")
    for choice in finished:
        calls: list[Any] = choice.message.tool_calls or []
        assert calls
        assert len({call.id for call in calls}) == len(calls)
        for call in calls:
            valid_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("name", ["add", "now"])
def test_a_named_choice_calls_that_function(client: openai.OpenAI, name: str) -> None:
    choice: Any = {"type": "function", "function": {"name": name}}
    fields: Any = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
    fields |= {"max_tokens": MAX_TOKENS, "temperature": 1.0}
    for seed in (1, 2):
        answer = client.chat.completions.create(**fields, seed=seed)
        (call,) = answer.choices[0].message.tool_calls or []
        assert (answer.choices[0].finish_reason, call.function.name) == ("tool_calls", name)
        valid_call(name, call.function.arguments)
        content, calls, finish = streamed_calls(
            client.chat.completions.create(**fields, seed=seed, stream=True)
        )
        assert (content, finish, [c[1] for c in calls]) == ("", "tool_calls", [name])
        assert calls[0][2] == call.function.arguments  # the same seed, the same call
        valid_call(name, calls[0][2])


def test_none_answers_text(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=16, seed=1
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS}, "tool_choice"),  # auto on a server without --tool-call-parser
        # refused by the scheduler's compile of the forced grammar
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"properties": {"x": {"type": "nonsense"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_bad_tools_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, streamed: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, stream=streamed, **fields
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == param


def test_a_conversation_with_tool_results(client: openai.OpenAI) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "paris", "unit": "c"}'},
    }
    history: Any = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    fields: Any = {"model": MODEL, "max_tokens": 4, "temperature": 0.0}
    plain = client.chat.completions.create(messages=MESSAGES, **fields)
    answer = client.chat.completions.create(
        messages=history, tools=TOOLS, tool_choice="none", **fields
    )
    with_tools = client.chat.completions.create(
        messages=history, tools=TOOLS, tool_choice="required", **fields
    )
    assert plain.usage is not None
    assert answer.usage is not None
    assert with_tools.usage is not None
    # the call and its result are in the prompt; the tools too unless the choice is none
    assert answer.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    assert with_tools.usage.prompt_tokens > answer.usage.prompt_tokens + 50
    # the client's own message object goes back as it came, with a result for its call
    called = client.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
    )
    message: Any = called.choices[0].message  # a pydantic object, which the client sends back
    (made,) = message.tool_calls or []
    result: Any = {"role": "tool", "tool_call_id": made.id, "content": "12"}
    again = client.chat.completions.create(
        messages=[*history, message, result],
        tools=TOOLS,
        tool_choice="none",
        **fields,
    )
    assert again.usage is not None
    assert again.usage.prompt_tokens > answer.usage.prompt_tokens


# Calls the model writes itself, in Hermes' format, with text before them.
HERMES_EBNF = (
    'root ::= "Let me look. " call call?\n'
    'call ::= "<tool_call>{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" '
    '"\\\\\\"" [a-z]{1,6} "\\\\\\"" "\\", \\"unit\\": \\"c\\"}}</tool_call>"'
)


def test_auto_parses_the_models_own_calls(hermes_client: openai.OpenAI) -> None:
    fields: Any = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": MAX_TOKENS}
    fields |= {"max_tokens": 400, "temperature": 1.0, "extra_body": {"ebnf": HERMES_EBNF}}
    for seed in (1, 2, 3):
        answer = hermes_client.chat.completions.create(**fields, seed=seed)
        choice = answer.choices[0]
        assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Let me look. ")
        calls = choice.message.tool_calls or []
        assert 1 <= len(calls) <= 2
        for call in calls:
            valid_call(call.function.name, call.function.arguments)
        content, streamed, finish = streamed_calls(
            hermes_client.chat.completions.create(**fields, seed=seed, stream=True)
        )
        assert (content, finish) == ("Let me look. ", "tool_calls")
        assert [(n, a) for _, n, a in streamed] == [
            (c.function.name, c.function.arguments) for c in calls
        ]
    # without a call in the output, auto answers text
    plain = hermes_client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=8,
        seed=1,
        extra_body={"regex": "[a-z ]{1,20}"},
    )
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason in ("stop", "length")
