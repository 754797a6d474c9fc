"""Every JSON Schema answer that ends with `stop` is strict JSON and valid: random schemas (the
keywords real schemas use: nested objects, arrays with minItems/maxItems, enum, const, anyOf,
$ref/$defs, format, bounded numbers, strings with minLength, maxLength and pattern, a required
property beyond the listed ones), some as a tool's parameters under a required or named
`tool_choice`, answered by the tiny random model at temperature 1 under several seeds, with and
without a `logit_bias` toward every token that holds a control character, a quotation mark or a
reverse solidus. Each answer that stops must
pass `json.loads` (strict: no raw control character) and `jsonschema.validate`.

In-process through the real scheduler and runner; the OpenAI-shaped HTTP API (response_format
and a named tool) and SmolLM2 (the default model) are checked with the same adversarial bias.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from conftest import TINY_SERVER_MODEL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_helpers import real_scheduler, request, run_to_completion
from tokenizers import Tokenizer

from srt.function_call.constraint import named_schema, required_schema
from srt.function_call.core_types import Tool
from srt.managers.scheduler import Scheduler
from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 320
SEEDS = (1, 2, 3)
BIAS = 30.0
_RIDS = itertools.count()
# Patterns whose lengths `json_pattern.bounded` can cut (one variable part), with characters
# only escapes can write among them; each with the fewest characters it matches.
BOUNDABLE_PATTERNS = {
    r"^[a-z]+$": 1,
    r'^"[^"]*"$': 2,
    r"^[\x00-\x1f]*$": 0,
    r"^\\[0-9]*$": 1,
    r"^x.*": 1,
}
PATTERNS = [r'^(yes|no|"maybe")$', r"^[A-Z]{2}\\[0-9]{1,3}$", r"^a.c$", r"^\d{2}:\d{2}$"]
# The formats whose every string xgrammar's grammar takes passes the format checker
# (test_schema_coverage.py shows the others' gaps).
EXACT_FORMATS = {"uuid", "email", "ipv6", "hostname", "uri"}
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
ODD_STRINGS = ['a"b', "back\\slash", "tab\there", "nl\n", "\x01", "é😀", "/"]


def strings() -> st.SearchStrategy[dict[str, Any]]:
    def bounded(low: int, extra: int, pattern: str | None) -> dict[str, Any]:
        high = max(low + extra, 0 if pattern is None else BOUNDABLE_PATTERNS[pattern])
        schema: dict[str, Any] = {"type": "string", "minLength": low, "maxLength": high}
        return schema if pattern is None else {**schema, "pattern": pattern}

    lengths = st.builds(
        bounded,
        st.integers(0, 3),
        st.integers(0, 5),
        st.none() | st.sampled_from(sorted(BOUNDABLE_PATTERNS)),
    )
    patterns = st.sampled_from(PATTERNS).map(lambda p: {"type": "string", "pattern": p})
    formats = st.sampled_from(sorted(EXACT_FORMATS)).map(lambda f: {"type": "string", "format": f})
    return st.one_of(lengths, patterns, formats)


def numbers() -> st.SearchStrategy[dict[str, Any]]:
    def integer(low: int, span: int, exclusive: bool) -> dict[str, Any]:
        if exclusive:
            return {"type": "integer", "exclusiveMinimum": low, "exclusiveMaximum": low + span + 2}
        return {"type": "integer", "minimum": low, "maximum": low + span}

    def number(low: float, span: float) -> dict[str, Any]:
        return {"type": "number", "minimum": low, "maximum": low + span}

    return st.one_of(
        st.builds(integer, st.integers(-50, 50), st.integers(0, 200), st.booleans()),
        st.builds(number, st.sampled_from([-2.5, 0, 0.5, 10]), st.sampled_from([0.5, 1, 100])),
    )


JSON_SCALARS = st.one_of(st.sampled_from(ODD_STRINGS), st.integers(-5, 5), st.booleans(), st.none())
LEAVES = st.one_of(
    strings(),
    numbers(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(JSON_SCALARS, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    JSON_SCALARS.map(lambda v: {"const": v}),
)


def nested(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def obj(props: dict[str, dict[str, Any]], required: list[bool], closed: bool) -> dict[str, Any]:
        """Closed: no property beside `props`; open: one more required, any value."""
        names = [n for n, r in zip(props, required, strict=False) if r]
        schema = {"type": "object", "properties": props, "required": names}
        if closed:
            return {**schema, "additionalProperties": False}
        return {**schema, "required": [*names, "more"]}

    def array(items: dict[str, Any], low: int, extra: int) -> dict[str, Any]:
        return {"type": "array", "items": items, "minItems": low, "maxItems": low + extra}

    keys = st.sampled_from(["a", "name", 'quote"d', "k\\ey", "n\tl", "id"])
    return st.one_of(
        st.builds(
            obj,
            st.dictionaries(keys, children, min_size=1, max_size=3),
            st.lists(st.booleans(), min_size=3, max_size=3),
            st.booleans(),
        ),
        st.builds(array, children, st.integers(0, 1), st.integers(0, 2)),
        st.lists(children, min_size=2, max_size=3).map(lambda b: {"anyOf": b}),
    )


def with_defs(schema: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    """`schema` inside an object beside a property that is a `$ref` to `shared`."""
    return {
        "type": "object",
        "properties": {"main": schema, "shared": {"$ref": "#/$defs/shared"}},
        "required": ["main", "shared"],
        "additionalProperties": False,
        "$defs": {"shared": shared},
    }


SCHEMAS = st.one_of(
    st.recursive(LEAVES, nested, max_leaves=5),
    st.builds(with_defs, st.recursive(LEAVES, nested, max_leaves=3), LEAVES),
)


@pytest.fixture(scope="module")
def model(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def scheduler(model: Path) -> Scheduler:
    return real_scheduler(model, max_total_tokens=8192)


def hostile_tokens(tokenizer: Tokenizer) -> list[int]:
    """The ids whose text holds a control character, a quotation mark or a reverse solidus."""
    ids = []
    for token in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token])
        if any(ord(c) < 0x20 or c in '"\\' for c in text):
            ids.append(token)
    return ids


def answers(
    scheduler: Scheduler,
    model: Path,
    schema_text: str,
    bias: list[int],
    seeds: Iterable[int] = SEEDS,
) -> list[tuple[str, str]]:
    """(text, finish type) of one request per seed, without and with the bias on `bias`."""
    settings = [(seed, biased) for seed in seeds for biased in (False, True)]
    rids = [f"r{next(_RIDS)}" for _ in settings]
    for rid, (seed, biased) in zip(rids, settings, strict=True):
        logit_bias = tuple((t, BIAS) for t in bias) if biased else ()
        req = request(
            rid,
            [7 + seed, 40, 99],
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=1.0,
            seed=seed,
            json_schema=schema_text,
            logit_bias=logit_bias,
        )
        scheduler.add_request(req)
    deadline = time.monotonic() + 60
    while len(scheduler.grammar_queue) and time.monotonic() < deadline:
        scheduler.step()
    finished = run_to_completion(scheduler)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    out = []
    for rid in rids:
        reason = finished[rid].reason
        assert reason.type in ("stop", "length"), (reason, schema_text)
        out.append((tokenizer.decode(finished[rid].output_ids), reason.type))
    return out


def check(outputs: list[tuple[str, str]], schema: Any) -> int:
    """Asserts every stopped output parses strictly and validates; returns how many stopped."""
    stopped = 0
    for text, finish in outputs:
        if finish == "stop":
            stopped += 1
            jsonschema.validate(json.loads(text), schema, format_checker=FORMAT_CHECKER)
    return stopped


@settings(
    max_examples=24,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schema=SCHEMAS, as_tool=st.sampled_from([None, "required", "named"]))
def test_every_stopped_answer_is_strict_json_that_validates(
    scheduler: Scheduler, model: Path, schema: dict[str, Any], as_tool: str | None
) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    if as_tool is not None and schema.get("type") == "object":
        tool = Tool("f", schema)
        text = (
            required_schema([tool], parallel=False) if as_tool == "required" else named_schema(tool)
        )
    else:
        text = json.dumps(schema)
    bias = hostile_tokens(Tokenizer.from_file(str(model / "tokenizer.json")))
    outputs = answers(scheduler, model, text, bias)
    assert check(outputs, json.loads(text)) >= 1, outputs  # not all cut off


# ---- through HTTP, and on SmolLM2 --------------------------------------------------------------

ISSUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "ok", "kind"],
    "additionalProperties": False,
}


def test_the_issues_schema_on_every_tiny_model(tiny_model: Path) -> None:
    """The issue's case: under this schema, 5 of 16 answers of the tiny Qwen2 at temperature 1
    held raw control characters."""
    scheduler = real_scheduler(tiny_model)
    bias = hostile_tokens(Tokenizer.from_file(str(tiny_model / "tokenizer.json")))
    outputs = answers(scheduler, tiny_model, json.dumps(ISSUE_SCHEMA), bias, seeds=range(16))
    assert check(outputs, ISSUE_SCHEMA) == len(outputs), outputs


def test_the_openai_api_answers_strict_json_under_a_hostile_bias(
    tiny_server: ServerProcess, model: Path
) -> None:
    client = openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)
    bias = {str(t): 100 for t in hostile_tokens(Tokenizer.from_file(str(model / "tokenizer.json")))}
    messages: Any = [{"role": "user", "content": "Name one."}]
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": ISSUE_SCHEMA},
    }
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": ISSUE_SCHEMA}}]
    named: Any = {"type": "function", "function": {"name": "f"}}
    stopped = 0
    for seed in range(4):
        common: Any = {"model": TINY_SERVER_MODEL, "messages": messages, "temperature": 1.0}
        common |= {"seed": seed, "max_tokens": 200, "logit_bias": bias}
        answer = client.chat.completions.create(**common, response_format=response_format)
        choice = answer.choices[0]
        if choice.finish_reason == "stop":
            stopped += 1
            assert choice.message.content is not None
            jsonschema.validate(json.loads(choice.message.content), ISSUE_SCHEMA)
        called = client.chat.completions.create(**common, tools=tools, tool_choice=named)
        for call in called.choices[0].message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), ISSUE_SCHEMA)
            stopped += 1
    assert stopped >= 4


def test_smollm2_answers_strict_json_under_a_hostile_bias(smollm2: Path) -> None:
    scheduler = real_scheduler(smollm2)
    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    bias = [t for t in hostile_tokens(tokenizer) if t not in scheduler.eos_token_ids]
    outputs = answers(scheduler, smollm2, json.dumps(ISSUE_SCHEMA), bias)
    assert check(outputs, ISSUE_SCHEMA) == len(outputs)
    biased = [text for (text, _), i in zip(outputs, range(len(outputs)), strict=True) if i % 2]
    assert any("\\" in text for text in biased)  # the bias did reach the strings: as escapes
