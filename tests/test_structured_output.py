"""Constrained decoding (JSON Schema, regex, EBNF through xgrammar) below the HTTP server.

The guarantee is tested on the tiny random model through the real scheduler and runner: with
random weights, the grammar alone makes the output valid, so every output under a bounded schema
(every path ends within `max_new_tokens`) must parse and validate, and every output under a
regex must match it, for several seeds and temperatures. The grammar queue's scheduling (a
compiling grammar blocks nobody, a failed one is a 400, an aborted request leaves nothing) runs
over the scripted runner, whose compiles the test finishes by hand.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar as xgr
from scheduler_helpers import (
    Finished,
    ScriptedRunner,
    collect,
    real_scheduler,
    request,
    run_to_completion,
)
from scheduler_helpers import scheduler_over as scripted_scheduler
from tokenizers import Tokenizer

from srt.constrained.grammar_mask import GrammarMasks, accept_tokens
from srt.constrained.xgrammar_backend import GrammarBackend
from srt.managers.grammar_input import to_ebnf, to_json_schema, to_regex
from srt.managers.scheduler import MIN_NEW_TOKEN_RATIO
from srt.model_executor.worker_batch import GRAMMAR_READY, GrammarStatus
from srt.request_limits import RequestError
from srt.sampling_params import SamplingParams

# Bounded: at most ~200 characters on any path (an escape `\uXXXX` is one character of a
# string's length, six of the output), within MAX_NEW_TOKENS. Its strings are bounded by
# minLength/maxLength and by a pattern that holds a quotation mark and a reverse solidus, which
# only escapes can write.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "fish"]},
        "quote": {"type": "string", "pattern": '^"[a-z]{1,3}\\\\[a-z]?"$'},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "quote", "tags"],
    "additionalProperties": False,
}
REGEX = r"(red|green|blue)-[0-9]{2,4}(\.[a-z]{1,3})?"
EBNF = 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [1-9] [0-9]?'
EBNF_LANGUAGE = re.compile(r"\(([1-9][0-9]?)(\+[1-9][0-9]?){0,3}\)")
MAX_NEW_TOKENS = 256
SETTINGS = [
    {"temperature": t, "seed": seed, "top_p": p}
    for t, p in ((0.0, 1.0), (0.7, 0.9), (1.0, 1.0), (1.5, 1.0))
    for seed in (1, 2, 3)
]


@pytest.fixture(scope="module")
def model(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


def decode(model: Path, ids: list[int]) -> str:
    return Tokenizer.from_file(str(model / "tokenizer.json")).decode(ids)


def constrained_outputs(
    model: Path,
    prompt_len: int = 3,
    max_new_tokens: int = MAX_NEW_TOKENS,
    small_kv: bool = False,
    **grammar: str,
) -> list[tuple[str, str]]:
    """(text, finish type) of the tiny model's outputs under `grammar`, one per `SETTINGS`,
    all run in one batch through the real scheduler and runner. With `small_kv`, a KV pool too
    small for the batch, which admission fills optimistically: requests are retracted (and
    prompts are prefilled in chunks of 16)."""
    if small_kv:
        scheduler = real_scheduler(model, max_total_tokens=160, chunked_prefill_size=16)
        scheduler.new_token_ratio = MIN_NEW_TOKEN_RATIO
    else:
        scheduler = real_scheduler(model)
    prompts = [[5 + i + 3 * j for j in range(prompt_len)] for i in range(len(SETTINGS))]
    for i, (prompt, settings) in enumerate(zip(prompts, SETTINGS, strict=True)):
        req = request(f"r{i}", prompt, max_new_tokens=max_new_tokens, **settings, **grammar)
        scheduler.add_request(req)
    deadline = time.monotonic() + 60
    while len(scheduler.grammar_queue) and time.monotonic() < deadline:
        scheduler.step()  # compiles run on the runner's thread meanwhile
    finished = run_to_completion(scheduler)
    assert (scheduler.num_retracted > 0) == small_kv
    out = []
    for i in range(len(SETTINGS)):
        done = finished[f"r{i}"]
        out.append((decode(model, done.output_ids), done.reason.type))
    return out


def test_every_output_under_a_bounded_schema_validates(model: Path) -> None:
    outputs = constrained_outputs(model, json_schema=json.dumps(SCHEMA))
    for text, finish in outputs:
        assert finish == "stop", text
        value = json.loads(text)  # strict: no raw control character
        jsonschema.validate(value, SCHEMA)
        assert "\n" not in text  # no free whitespace
        assert "  " not in text
    assert len({text for text, _ in outputs}) > 1  # sampling still samples


def test_every_output_under_a_regex_matches_it(model: Path) -> None:
    for text, finish in constrained_outputs(model, regex=REGEX):
        assert finish == "stop"
        assert re.fullmatch(REGEX, text), text


def test_every_output_under_an_ebnf_grammar_is_in_its_language(model: Path) -> None:
    for text, finish in constrained_outputs(model, ebnf=EBNF):
        assert finish == "stop"
        assert EBNF_LANGUAGE.fullmatch(text), text


def test_retracted_and_chunked_constrained_requests_keep_their_grammar(model: Path) -> None:
    """A KV pool too small for the batch retracts requests mid-output (their long outputs
    outgrow what admission reserved), and prompts are prefilled in chunks: the matchers, which
    live with the requests' sampling state, still see each token exactly once."""
    outputs = constrained_outputs(
        model, prompt_len=24, max_new_tokens=41, small_kv=True, regex="[0-9]{40}"
    )
    for text, finish in outputs:
        assert finish == "stop", text
        assert re.fullmatch("[0-9]{40}", text), text


# ---- the grammar queue ------------------------------------------------------------------------


def test_a_compiling_grammar_blocks_no_other_request() -> None:
    runner = ScriptedRunner()
    scheduler = scripted_scheduler(runner)
    scheduler.add_request(request("json", [5, 6], max_new_tokens=3, json_schema="{}"))
    scheduler.add_request(request("plain", [7, 8], max_new_tokens=3, ignore_eos=True))
    outputs: dict[str, list[int]] = {}
    done: dict[str, Finished] = {}
    for _ in range(4):
        collect(scheduler.step(), outputs, done)
    assert done["plain"].reason.type == "length"  # ran to its end meanwhile
    assert scheduler.grammar_queue.get("json") is not None
    assert "json" not in runner.specs  # never admitted while compiling
    load = scheduler.get_load()
    assert (load.num_waiting_reqs, load.num_waiting_tokens) == (1, 2)  # the json request's prompt
    runner.grammars[("json_schema", "{}")] = GRAMMAR_READY
    assert len(run_to_completion(scheduler)["json"].output_ids) == 3


def test_a_grammar_that_cannot_compile_is_refused_with_a_400_naming_it() -> None:
    runner = ScriptedRunner()
    scheduler = scripted_scheduler(runner)
    runner.grammars[("regex", "a(?=b)")] = GrammarStatus(error="regex is invalid: lookahead")
    scheduler.add_request(request("bad", [5, 6], regex="a(?=b)"))
    reason = run_to_completion(scheduler)["bad"].reason
    assert (reason.type, reason.status_code, reason.param) == (
        "abort",
        400,
        "sampling_params.regex",
    )
    assert not runner.passes  # refused before it ever ran


def test_aborting_a_request_waiting_for_its_grammar_leaves_nothing() -> None:
    runner = ScriptedRunner()
    scheduler = scripted_scheduler(runner)
    scheduler.add_request(request("a", [5, 6], ebnf='root ::= "x"'))
    scheduler.step()
    scheduler.abort("a")
    finished = run_to_completion(scheduler)
    assert finished["a"].reason.type == "abort"
    assert not scheduler.grammar_queue
    assert not runner.specs


def test_aborting_a_constrained_request_drops_its_matcher(model: Path) -> None:
    scheduler = real_scheduler(model)
    scheduler.add_request(request("a", [5, 6], max_new_tokens=50, regex="[a-z]{40,60}"))
    while scheduler.running.get("a") is None:
        scheduler.step()
    scheduler.step()
    assert scheduler.runner.sampling.states["a"].matcher is not None  # type: ignore[attr-defined]
    scheduler.abort("a")
    run_to_completion(scheduler)  # checks that no sampling state (with its matcher) is left


# ---- the backend and the masks ---------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(model: Path) -> GrammarBackend:
    config = json.loads((model / "config.json").read_text())
    # 64 columns past the tokenizer's vocabulary, as padded models have them.
    return GrammarBackend(str(model), config["vocab_size"] + 64, [config["eos_token_id"]])


def wait_for(backend: GrammarBackend, kind: str, text: str) -> GrammarStatus:
    deadline = time.monotonic() + 30
    while not (status := backend.status(kind, text)).ready and status.error is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return status


def test_the_backend_compiles_once_per_grammar_and_names_bad_ones(
    backend: GrammarBackend,
) -> None:
    assert wait_for(backend, "regex", "[0-9]+").ready
    future = backend.cache[("regex", "[0-9]+")]
    assert backend.status("regex", "[0-9]+").ready
    assert backend.cache[("regex", "[0-9]+")] is future
    for kind, text in [
        ("regex", "a(?=b)"),
        ("ebnf", 'root ::= "a" missing'),
        ("json_schema", '{"type": "nonsense"}'),
    ]:
        error = wait_for(backend, kind, text).error
        assert error is not None
        assert error.startswith(f"sampling parameter {kind} is invalid: ")
        assert ".cc:" not in error  # no C++ source locations for clients


def test_masks_touch_only_constrained_rows_and_the_padding(backend: GrammarBackend) -> None:
    assert wait_for(backend, "regex", "[0-9]+").ready
    vocab = backend.vocab_size
    masks = GrammarMasks(vocab)
    matchers = [None, backend.matcher("regex", "[0-9]+"), None]
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    masks.apply(logits, matchers)
    assert torch.equal(logits[0], before[0])
    assert torch.equal(logits[2], before[2])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    tokenizer = Tokenizer.from_file(str(backend.tokenizer_path) + "/tokenizer.json")
    assert allowed
    assert all(re.fullmatch("[0-9]+", tokenizer.decode([t])) for t in allowed)
    assert max(allowed) < tokenizer.get_vocab_size()  # padded ids are never allowed
    token = allowed[0]
    assert accept_tokens(matchers, [0, token, 0]) == frozenset()
    eos = backend.stop_token_ids[0]
    assert accept_tokens(matchers, [0, eos, 0]) == frozenset({1})  # the grammar ended


def test_a_matcher_refusing_a_token_ends_its_row(backend: GrammarBackend) -> None:
    assert wait_for(backend, "regex", "[0-9]+").ready
    matcher: xgr.GrammarMatcher | None = backend.matcher("regex", "[0-9]+")
    tokenizer = Tokenizer.from_file(str(backend.tokenizer_path) + "/tokenizer.json")
    letter = tokenizer.token_to_id("a")
    assert letter is not None
    assert accept_tokens([matcher], [letter]) == frozenset({0})


# ---- what the main process checks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("convert", "value"),
    [
        (to_json_schema, "{not json"),
        (to_json_schema, "[1, 2]"),
        (to_json_schema, 3),
        (to_regex, "a(b"),
        (to_regex, ""),
        (to_regex, 5),
        (to_ebnf, 'rule ::= "a"'),
        (to_ebnf, None),
    ],
)
def test_the_main_process_refuses_what_cannot_be_a_grammar(
    convert: Callable[[str, Any], str], value: Any
) -> None:
    with pytest.raises(RequestError) as info:
        convert("field", value)
    assert info.value.param == "field"


def test_a_schema_given_as_json_keeps_its_key_order() -> None:
    schema = {"type": "object", "properties": {"z": {}, "a": {}}}
    assert json.loads(to_json_schema("json_schema", schema)) == schema
    assert to_json_schema("json_schema", schema).index('"z"') < to_json_schema(
        "json_schema", schema
    ).index('"a"')


def test_sampling_params_take_one_grammar_without_min_tokens() -> None:
    assert SamplingParams(regex="a+").grammar == ("regex", "a+")
    assert SamplingParams().grammar is None
    with pytest.raises(RequestError):
        SamplingParams(regex="a+", json_schema="{}")
    with pytest.raises(RequestError) as info:
        SamplingParams(regex="a+", min_new_tokens=2, max_new_tokens=4)
    assert info.value.param == "min_new_tokens"
