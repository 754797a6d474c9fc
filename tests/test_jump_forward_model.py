"""Jump-forward decoding (`--enable-jump-forward`) on the tiny random model, whose grammar
forces long keys: the runner's half (the forced text tokenized, the matcher advanced over it),
and the guarantee through the real scheduler and runner: outputs still validate for many seeds,
streamed or not (through HTTP too), retracted or not, with fewer forward passes; stop strings and
`max_new_tokens` still end outputs exactly; forced tokens report logprob 0. Whitespace in JSON
only when asked for. The scheduler's bookkeeping over scripted jumps is in test_jump_forward.py.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from runner_helpers import make_runner
from scheduler_helpers import Finished, collect, real_scheduler, request, run_to_completion
from test_http_native import call, load, stream
from tokenizers import Tokenizer

from srt.constrained.grammar_mask import GrammarMasks
from srt.constrained.jump_forward import MIN_GAIN, jump
from srt.constrained.xgrammar_backend import GrammarBackend
from srt.io_struct import BatchTokenIDOut
from srt.managers.scheduler import MIN_NEW_TOKEN_RATIO, Scheduler
from srt.testing.server_process import running_server

# Long fixed keys (what jump-forward saves passes on), bounded values: every path ends within
# MAX_NEW_TOKENS (a name of 6 characters, each escape `\uXXXX` one of them, is at most 72
# characters of output). The name is bounded by minLength/maxLength, a grammar srt writes.
LONG_KEYS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "minLength": 1, "maxLength": 6},
        "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 999},
        "preferred_contact_method": {"enum": ["electronic_mail", "telephone"]},
        "subscribed_to_the_newsletter": {"type": "boolean"},
    },
    "required": [
        "customer_full_name",
        "customer_account_identifier",
        "preferred_contact_method",
        "subscribed_to_the_newsletter",
    ],
    "additionalProperties": False,
}
MAX_NEW_TOKENS = 256
SETTINGS = [
    {"temperature": t, "seed": seed, "top_p": p}
    for t, p in ((0.0, 1.0), (0.7, 0.9), (1.0, 1.0), (1.5, 1.0))
    for seed in (1, 2, 3, 4)
]


@pytest.fixture(scope="module")
def model(tiny_model_factory: Callable[[str], Path]) -> Path:
    return tiny_model_factory("llama")


def decode(model: Path, ids: list[int]) -> str:
    return Tokenizer.from_file(str(model / "tokenizer.json")).decode(ids)


def run(
    scheduler: Scheduler, reqs: list[dict[str, Any]], outs: list[BatchTokenIDOut] | None = None
) -> dict[str, Finished]:
    """Runs `reqs` (request keyword arguments, rid included) to completion, checking the KV
    invariant after every step; every message goes to `outs`."""
    for kwargs in reqs:
        kwargs = dict(kwargs)
        scheduler.add_request(request(kwargs.pop("rid"), kwargs.pop("prompt"), **kwargs))
    outputs: dict[str, list[int]] = {}
    finished: dict[str, Finished] = {}
    deadline = time.monotonic() + 120  # grammars compile on the runner's thread meanwhile
    while scheduler.has_work():
        assert time.monotonic() < deadline
        out = scheduler.step()
        assert scheduler.check_invariants() == []
        if outs is not None and out is not None:
            outs.append(out)
        collect(out, outputs, finished)
    # No KV slot, lock or sampling state outlives the requests.
    assert run_to_completion(scheduler) == {}
    return finished


def batch(**params: Any) -> list[dict[str, Any]]:
    return [
        {"rid": f"r{i}", "prompt": [5 + i, 9 + 2 * i, 40], "json_schema": json.dumps(LONG_KEYS)}
        | {"max_new_tokens": MAX_NEW_TOKENS}
        | settings
        | params
        for i, settings in enumerate(SETTINGS)
    ]


# ---- the runner's half: tokenizing forced text ------------------------------------------------


@pytest.fixture(scope="module")
def backend(model: Path) -> GrammarBackend:
    config = json.loads((model / "config.json").read_text())
    return GrammarBackend(str(model), config["vocab_size"], [config["eos_token_id"]])


def ready(backend: GrammarBackend, kind: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while not backend.status(kind, text).ready:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_jump_spells_the_forced_text_and_leaves_an_extensible_last_token(
    backend: GrammarBackend, model: Path
) -> None:
    schema = json.dumps(LONG_KEYS)
    ready(backend, "json_schema", schema)
    tokens = backend.forced_tokenizer()
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    for first, max_rollback in (("{", 1), ("{", 0), ('{"', 1)):
        matcher = backend.matcher("json_schema", schema)
        output = tokenizer.encode(first, add_special_tokens=False).ids
        assert all(matcher.accept_token(t) for t in output)
        forced = matcher.find_jump_forward_string()
        made = jump(matcher, tokens, output, max_rollback, budget=100)
        assert made is not None
        assert made.rollback <= max_rollback
        kept = output[: len(output) - made.rollback]
        text = decode(model, kept + made.ids)
        # What the jump left of the forced text is still forced: nothing was lost or invented.
        assert text + matcher.find_jump_forward_string() == first + forced
        assert len(made.ids) - made.rollback >= MIN_GAIN
    # Within budget: the output grows by at most `budget`.
    matcher = backend.matcher("json_schema", schema)
    made = jump(matcher, tokens, [], 0, budget=3)
    assert made is not None
    assert (made.rollback, len(made.ids)) == (0, 3)
    assert jump(matcher, tokens, made.ids, 0, budget=0) is None


def test_no_jump_where_the_grammar_forces_nothing(backend: GrammarBackend) -> None:
    ready(backend, "regex", "[0-9]+")
    matcher = backend.matcher("regex", "[0-9]+")
    assert jump(matcher, backend.forced_tokenizer(), [], 0, budget=10) is None
    ready(backend, "regex", "ab")
    matcher = backend.matcher("regex", "ab")
    assert matcher.accept_string("ab")
    assert matcher.accept_token(backend.stop_token_ids[0])
    assert jump(matcher, backend.forced_tokenizer(), [], 0, budget=10) is None  # terminated


def test_json_whitespace_only_when_asked_for(model: Path) -> None:
    config = json.loads((model / "config.json").read_text())
    schema = json.dumps(LONG_KEYS)
    for any_whitespace in (False, True):
        stop = [config["eos_token_id"]]
        backend = GrammarBackend(
            str(model), config["vocab_size"], stop, any_whitespace=any_whitespace
        )
        ready(backend, "json_schema", schema)
        matcher = backend.matcher("json_schema", schema)
        assert matcher.accept_string('{\n  "customer_full_name"') is any_whitespace
    runner = real_scheduler(model, constrained_json_any_whitespace=True).runner
    assert runner.grammars.any_whitespace  # type: ignore[attr-defined]


# ---- the guarantee ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_outputs_under_a_bounded_schema_validate_with_jumps(model: Path, stream: bool) -> None:
    scheduler = real_scheduler(model, enable_jump_forward=True)
    done = run(scheduler, batch(stream=stream))
    texts = []
    for rid, finished in done.items():
        text = decode(model, finished.output_ids)  # for a stream: what it was sent, in order
        assert finished.reason.type == "stop", (rid, text)
        jsonschema.validate(json.loads(text), LONG_KEYS)
        texts.append(text)
    assert len(set(texts)) > 1  # sampling still samples
    assert scheduler.jump_forward.num_forced_tokens >= 20 * len(SETTINGS)


def test_retracted_requests_jump_and_still_match(model: Path) -> None:
    """A KV pool too small for the batch: requests are retracted while they sample digits,
    and jump over the fixed text between them (prompts prefilled in chunks of 16)."""
    scheduler = real_scheduler(
        model, enable_jump_forward=True, max_total_tokens=160, chunked_prefill_size=16
    )
    scheduler.new_token_ratio = MIN_NEW_TOKEN_RATIO
    regex = "[0-9]{40}_fixed_separator_[0-9]{8}"
    reqs = [
        {"rid": f"r{i}", "prompt": [30 + i + 3 * j for j in range(24)], "regex": regex}
        | {"max_new_tokens": 64}
        | settings
        for i, settings in enumerate(SETTINGS)
    ]
    done = run(scheduler, reqs)
    assert scheduler.num_retracted > 0
    assert scheduler.jump_forward.num_jumps >= len(SETTINGS)
    for finished in done.values():
        text = decode(model, finished.output_ids)
        assert finished.reason.type == "stop", text
        assert re.fullmatch(regex, text), text


def test_jumps_save_forward_passes_on_long_fixed_keys(model: Path) -> None:
    passes = {}
    for enabled in (False, True):
        scheduler = real_scheduler(model, enable_jump_forward=enabled)
        for r in batch()[:4]:  # greedy, one at a time
            done = run(scheduler, [r])
            jsonschema.validate(json.loads(decode(model, done[r["rid"]].output_ids)), LONG_KEYS)
        passes[enabled] = scheduler.batch_log.num_batches
    # The keys alone are ~110 forced characters a request.
    assert passes[True] < passes[False] / 2, passes


def test_max_new_tokens_and_stop_strings_end_a_jumping_output_exactly(model: Path) -> None:
    scheduler = real_scheduler(model, enable_jump_forward=True)
    done = run(scheduler, batch(max_new_tokens=9))
    for finished in done.values():
        assert (finished.reason.type, len(finished.output_ids)) == ("length", 9)
    assert scheduler.jump_forward.num_jumps > 0
    # A stop string inside a forced key: the output ends with the token that completes it.
    done = run(scheduler, batch(stop=["account_ident"], max_new_tokens=MAX_NEW_TOKENS))
    for finished in done.values():
        reason = finished.reason
        assert (reason.type, reason.matched_str) == ("stop", "account_ident")
        text = decode(model, finished.output_ids)
        assert text.index("account_ident") == reason.matched_offset
        assert "account_ident" not in decode(model, finished.output_ids[:-1])


def test_logprobs_of_forced_tokens_are_zero(model: Path) -> None:
    scheduler = real_scheduler(model, enable_jump_forward=True)
    outs: list[BatchTokenIDOut] = []
    done = run(scheduler, batch(return_logprob=True, top_logprobs_num=1)[:4], outs)
    logprobs: dict[str, list[float]] = {}
    tops: dict[str, list[tuple[tuple[int, float], ...]]] = {}
    for out in outs:
        pairs = zip(out.output_logprobs, out.output_top_logprobs, strict=True)
        for rid, (lps, top) in zip(out.rids, pairs, strict=True):
            logprobs.setdefault(rid, []).extend(lps)
            tops.setdefault(rid, []).extend(top)
    forced = 0
    for rid, finished in done.items():
        ids = finished.output_ids
        assert len(logprobs[rid]) == len(tops[rid]) == len(ids)
        assert all(lp <= 0.0 for lp in logprobs[rid])
        # Forced tokens report 0.0, and themselves as their only top pair.
        forced += sum(
            1
            for t, lp, top in zip(ids, logprobs[rid], tops[rid], strict=True)
            if lp == 0.0 and top == ((t, 0.0),)
        )
    jumped = scheduler.jump_forward
    assert forced >= jumped.num_forced_tokens - jumped.num_rolled_back > 0


def test_the_kv_a_jumped_request_reuses_is_its_own(model: Path) -> None:
    """Each sampled token's reported logprob (computed after jumps, over KV the request got
    back from the radix cache) equals the one a single fresh forward pass over the prompt and
    the whole output gives, under the same grammar mask: the cached prefix was valid."""
    scheduler = real_scheduler(model, enable_jump_forward=True)
    outs: list[BatchTokenIDOut] = []
    reqs = batch(return_logprob=True)[:2] + batch(return_logprob=True, temperature=1.0)[9:11]
    done = run(scheduler, reqs, outs)
    assert scheduler.jump_forward.num_jumps > 0
    reported: dict[str, list[float]] = {}
    for out in outs:
        for rid, lps in zip(out.rids, out.output_logprobs, strict=True):
            reported.setdefault(rid, []).extend(lps)
    runner = make_runner(model, max_total_tokens=1024)
    grammars = runner.grammars
    schema = json.dumps(LONG_KEYS)
    masks = GrammarMasks(grammars.vocab_size)
    checked = 0
    for r in reqs:
        output, prompt = done[r["rid"]].output_ids, r["prompt"]
        ids = prompt + output[:-1]  # the last output token is the grammar's EOS
        batch_ = runner.prepare_extend([0], [0], [ids], list(range(1, len(ids) + 1)), [len(output)])
        logits = runner.forward(batch_)
        ready(grammars, "json_schema", schema)
        matcher = grammars.matcher("json_schema", schema)
        for i, token in enumerate(output):
            row = logits[i : i + 1].clone()
            masks.apply(row, [matcher])
            fresh = torch.log_softmax(row, dim=-1)[0, token].item()
            if reported[r["rid"]][i] != 0.0:  # sampled (forced tokens report 0.0)
                assert fresh == pytest.approx(reported[r["rid"]][i], abs=1e-4), (r["rid"], i)
                checked += 1
            assert matcher.accept_token(token)
    assert checked > 20


@pytest.mark.slow
def test_http_outputs_validate_with_jumps_streamed_and_not(model: Path) -> None:
    """Through the detokenizer: a stream's text only grows (nothing sent is taken back)."""
    with running_server(model, "--enable-jump-forward") as server:
        for temperature, seed in ((0.0, 1), (1.0, 2), (1.5, 3)):
            params = {
                "json_schema": json.dumps(LONG_KEYS),
                "max_new_tokens": MAX_NEW_TOKENS,
                "temperature": temperature,
                "seed": seed,
            }
            body = {"text": ["Customer:", "Record:"], "sampling_params": params}
            status, results = call(server, "POST", "/generate", body)
            assert status == 200
            events = stream(server, {"text": "Customer:", "sampling_params": params})
            assert events[-1] == "[DONE]"
            texts = [event["text"] for event in events[:-1]]
            assert all(b.startswith(a) for a, b in itertools.pairwise(texts)), texts
            for result in [*results, events[-2]]:
                assert result["meta_info"]["finish_reason"]["type"] == "stop"
                jsonschema.validate(json.loads(result["text"]), LONG_KEYS)
        assert load(server)["num_used_tokens"] == 0
