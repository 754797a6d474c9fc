"""Structured output through real HTTP against the session's `srt-serve` on the tiny random
model: SGLang's `json_schema`/`regex`/`ebnf` sampling parameters on `/generate`, OpenAI's
`response_format` through the official `openai` client, streamed and not, and the 400s (naming
the field) of grammars that the main process or the scheduler's compile refuses."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from conftest import TINY_SERVER_MODEL
from test_http_native import call, load, stream

from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

# Bounded: every path ends within MAX_TOKENS (a city of 8 characters, each escape `\uXXXX` one
# of them, is at most 96 characters of output).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 8},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[0-9]{4}"
MAX_TOKENS = 160
MESSAGES: Any = [{"role": "user", "content": "Describe a city."}]


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def valid(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("temperature", [0.0, 0.8, 1.3])
def test_generate_under_a_schema_or_a_regex_streamed_and_not(
    server: ServerProcess, temperature: float
) -> None:
    params = {"max_new_tokens": MAX_TOKENS, "temperature": temperature}
    schema = {"json_schema": json.dumps(SCHEMA), **params}
    regex = {"regex": REGEX, **params}
    for seed in (1, 2):
        body = {"text": ["Hello", "City:"], "sampling_params": {**schema, "seed": seed}}
        status, results = call(server, "POST", "/generate", body)
        assert status == 200
        for result in results:
            assert result["meta_info"]["finish_reason"]["type"] == "stop"
            valid(result["text"])
        events = stream(server, {"text": "Phone:", "sampling_params": {**regex, "seed": seed}})
        assert events[-1] == "[DONE]"
        last = events[-2]
        assert last["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch(REGEX, last["text"]), last["text"]
    assert load(server)["num_used_tokens"] == 0


def test_openai_response_format_json_schema(client: openai.OpenAI) -> None:
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
    }
    for seed in (1, 2, 3):
        answer = client.chat.completions.create(
            model=TINY_SERVER_MODEL,
            messages=MESSAGES,
            response_format=response_format,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed,
            n=2,
        )
        for choice in answer.choices:
            assert choice.finish_reason == "stop"
            assert choice.message.content is not None
            valid(choice.message.content)
    chunks = client.chat.completions.create(
        model=TINY_SERVER_MODEL,
        messages=MESSAGES,
        response_format=response_format,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=7,
        stream=True,
    )
    pieces, finish = [], None
    for chunk in chunks:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    valid("".join(pieces))


def test_openai_completions_take_response_format_and_sglang_fields(
    client: openai.OpenAI,
) -> None:
    answer = client.completions.create(
        model=TINY_SERVER_MODEL,
        prompt="Code:",
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        extra_body={"regex": REGEX},
    )
    assert re.fullmatch(REGEX, answer.choices[0].text)
    # Any JSON object: on random weights it may not close within the tokens allowed, so only
    # its start is certain.
    answer = client.completions.create(
        model=TINY_SERVER_MODEL,
        prompt="Object:",
        max_tokens=16,
        temperature=0.0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    text = answer.choices[0].text
    assert text.startswith("{")
    if answer.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # refused by the main process
        ({"regex": "[0-9"}, "regex"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"ebnf": 'start ::= "a"'}, "ebnf"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
            "response_format",
        ),
        # refused by the scheduler's compile, still before the request is queued
        ({"regex": r"\bword"}, "regex"),
        ({"ebnf": "root ::= undefined_rule"}, "ebnf"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format",
        ),
    ],
)
@pytest.mark.parametrize("streamed", [False, True])
def test_bad_grammars_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, streamed: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=TINY_SERVER_MODEL,
            messages=MESSAGES,
            max_tokens=8,
            stream=streamed,
            extra_body=fields,
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == param


def test_native_bad_grammars_are_400_naming_the_field(server: ServerProcess) -> None:
    for grammar in ({"regex": "[0-9"}, {"regex": r"\bword"}):
        body = {"text": "x", "sampling_params": {"max_new_tokens": 4, **grammar}}
        status, error = call(server, "POST", "/generate", body)
        assert status == 400, error
        assert error["error"]["param"] == "sampling_params.regex"
    assert load(server)["num_used_tokens"] == 0
