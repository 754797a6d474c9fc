"""OpenAI bodies into generate inputs (every bad field a 400 naming it), and SGLang-shaped
results into OpenAI responses and chunks, checked against the `openai` client's own types."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.openai_protocol import parse_chat_request, parse_completion_request
from srt.entrypoints.http.openai_responses import ResponseBuilder
from srt.managers.generate_req_input import expand

MODEL = "tiny"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory: Callable[[str], Path]) -> PreTrainedTokenizerBase:
    tok: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(tiny_model_factory("llama"))
    return tok


def completion(tokenizer: PreTrainedTokenizerBase, **fields: Any) -> Any:
    return parse_completion_request({"model": MODEL, "prompt": "hi", **fields}, MODEL, tokenizer)


def chat(tokenizer: PreTrainedTokenizerBase, **fields: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(body, MODEL, tokenizer)


def refused(call: Callable[[], Any], param: str | None, status: int = 400) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    assert (info.value.status, info.value.param) == (status, param), info.value.message
    return info.value


# ---- requests ------------------------------------------------------------------------------


def test_completion_fields_map_to_sglang_sampling_names(tokenizer: PreTrainedTokenizerBase) -> None:
    req = completion(
        tokenizer,
        max_tokens=5,
        temperature=0,
        stop="x",
        n=2,
        seed=3,
        logit_bias={"7": -100},
        top_k=4,
        min_tokens=2,
        ignore_eos=True,
        user="u1",
    )
    assert req.response_id.startswith("cmpl-")
    assert not req.chat
    assert req.n == 2
    assert req.obj.text == ["hi"]
    assert not req.stream
    assert req.top_logprobs is None
    assert req.obj.sampling_params == {
        "max_new_tokens": 5,
        "n": 2,
        "temperature": 0,
        "stop": "x",
        "seed": 3,
        "logit_bias": {"7": -100},
        "top_k": 4,
        "min_new_tokens": 2,
        "ignore_eos": True,
    }
    reqs = expand(req.obj)
    assert [r.rid for r in reqs] == [f"{req.response_id}-0", f"{req.response_id}-1"]
    assert [r.sampling_kwargs["seed"] for r in reqs] == [3, 4]


def test_no_max_tokens_means_up_to_the_context(tokenizer: PreTrainedTokenizerBase) -> None:
    assert completion(tokenizer).obj.sampling_params == {"max_new_tokens": None, "n": 1}
    assert completion(tokenizer, max_tokens=None).obj.sampling_params["max_new_tokens"] is None


@pytest.mark.parametrize(
    ("prompt", "texts", "ids"),
    [
        ("a b", ["a b"], None),
        (["a", "b"], ["a", "b"], None),
        ([1, 2], None, [[1, 2]]),
        ([[1, 2], [3]], None, [[1, 2], [3]]),
    ],
)
def test_the_four_prompt_forms(
    tokenizer: PreTrainedTokenizerBase, prompt: Any, texts: Any, ids: Any
) -> None:
    req = completion(tokenizer, prompt=prompt, n=2)
    assert (req.obj.text, req.obj.input_ids) == (texts, ids)
    assert len(expand(req.obj)) == 2 * len(texts or ids)


@pytest.mark.parametrize(
    "prompt", ["", [], [""], [[]], [1, "a"], [[1], "a"], [-1], [1.5], None, 3, [True]]
)
def test_bad_prompts(tokenizer: PreTrainedTokenizerBase, prompt: Any) -> None:
    refused(lambda: completion(tokenizer, prompt=prompt), "prompt")


def test_echo_prefixes_the_prompt_text(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    assert completion(tokenizer, prompt=["a", "b"], echo=True).echo_texts == ["a", "b"]
    assert completion(tokenizer, prompt=ids, echo=True).echo_texts == ["hello there"]
    assert completion(tokenizer).echo_texts is None


def test_the_model_must_be_the_served_one(tokenizer: PreTrainedTokenizerBase) -> None:
    error = refused(lambda: completion(tokenizer, model="gpt-4"), "model", status=404)
    assert error.code == "model_not_found"
    assert MODEL in error.message
    refused(lambda: chat(tokenizer, model="gpt-4"), "model", status=404)
    refused(lambda: completion(tokenizer, model=None), "model")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "hot"),
        ("temperature", -1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", True),
        ("top_p", 0),
        ("top_p", 1.5),
        ("presence_penalty", 3),
        ("frequency_penalty", float("-inf")),
        ("max_tokens", "10"),
        ("max_tokens", -1),
        ("max_tokens", 2.0),
        ("min_tokens", -1),
        ("n", 0),
        ("n", 129),
        ("n", "2"),
        ("stop", 3),
        ("stop", [""]),
        ("stop", ["a", 1]),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", "1"),
        ("logit_bias", {"x": 1}),
        ("logit_bias", {"1": 101}),
        ("logit_bias", [1]),
        ("top_k", 0),
        ("min_p", 2),
        ("repetition_penalty", 0),
        ("stop_token_ids", [-1]),
        ("ignore_eos", 1),
        ("stream", "yes"),
        ("logprobs", -1),
        ("logprobs", 21),
        ("echo", "yes"),
        ("user", 5),
        ("suffix", "tail"),
        ("best_of", 3),
        ("stream_options", {"include_usage": True}),
        ("frobnicate", 1),
    ],
)
def test_bad_completion_fields_name_themselves(
    tokenizer: PreTrainedTokenizerBase, field: str, value: Any
) -> None:
    refused(lambda: completion(tokenizer, **{field: value}), field)


def test_min_tokens_beyond_max_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    refused(lambda: completion(tokenizer, min_tokens=5, max_tokens=2), "min_tokens")


def test_echo_with_logprobs_asks_for_the_prompt_logprobs(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    assert completion(tokenizer, echo=True, logprobs=1).obj.logprob_start_len == 0
    assert completion(tokenizer, echo=True, logprobs=0).obj.logprob_start_len == 0
    assert completion(tokenizer, echo=True).obj.logprob_start_len == -1
    assert completion(tokenizer, logprobs=1).obj.logprob_start_len == -1


def test_stream_options(tokenizer: PreTrainedTokenizerBase) -> None:
    opts = {"include_usage": True}
    assert completion(tokenizer, stream=True, stream_options=opts).include_usage
    assert not completion(tokenizer, stream=True).include_usage
    bad = {"include_usage": 1}
    refused(lambda: completion(tokenizer, stream=True, stream_options=bad), "stream_options")
    odd = {"other": True}
    refused(lambda: completion(tokenizer, stream=True, stream_options=odd), "stream_options")


def test_chat_renders_the_template_once_without_a_second_bos(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": "hello", "name": "bot"},
        {"role": "user", "content": "again"},
    ]
    req = chat(tokenizer, messages=messages, max_completion_tokens=3, store=True, metadata={})
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi !"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert isinstance(text, str)
    assert text.endswith("<|im_start|>assistant\n")
    assert req.chat
    assert req.response_id.startswith("chatcmpl-")
    (ids,) = req.obj.input_ids
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] != tokenizer.bos_token_id
    assert req.obj.sampling_params["max_new_tokens"] == 3


def test_chat_logprobs(tokenizer: PreTrainedTokenizerBase) -> None:
    assert chat(tokenizer).top_logprobs is None
    assert chat(tokenizer, logprobs=True).top_logprobs == 0
    req = chat(tokenizer, logprobs=True, top_logprobs=3)
    assert (req.top_logprobs, req.obj.return_logprob, req.obj.top_logprobs_num) == (3, True, 3)
    refused(lambda: chat(tokenizer, top_logprobs=3), "top_logprobs")
    refused(lambda: chat(tokenizer, logprobs=3), "logprobs")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]},
            "messages[0].tool_calls",
        ),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"max_tokens": 2, "max_completion_tokens": 3}, "max_tokens"),
        ({"max_completion_tokens": -2}, "max_completion_tokens"),
        ({"echo": True}, "echo"),
    ],
)
def test_bad_chat_requests(
    tokenizer: PreTrainedTokenizerBase, fields: dict[str, Any], param: str
) -> None:
    refused(lambda: chat(tokenizer, **fields), param)


def test_a_model_without_a_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    try:
        error = refused(lambda: chat(tokenizer), "messages")
    finally:
        tokenizer.chat_template = template
    assert "/v1/completions" in error.message


# ---- responses -----------------------------------------------------------------------------


def result(
    text: str,
    ids: list[int],
    finish: dict[str, Any] | None,
    index: int | None = None,
    prompt_tokens: int = 4,
    cached_tokens: int = 0,
    logprobs: bool = False,
    completion_tokens: int | None = None,
    prompt_ids: list[int] | None = None,
) -> dict[str, Any]:
    """A result (or stream chunk) in the tokenizer manager's shape: a chunk's
    `completion_tokens` counts all tokens so far; with `prompt_ids`, the prompt logprobs of
    `logprob_start_len` 0 and one top alternative."""
    meta: dict[str, Any] = {
        "id": "r",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(ids) if completion_tokens is None else completion_tokens,
        "cached_tokens": cached_tokens,
        "finish_reason": finish,
        "e2e_latency": 0.1,
    }
    if logprobs:
        meta["output_token_logprobs"] = [(-0.5, t, None) for t in ids]
        meta["output_top_logprobs"] = [[(-0.5, t, None), (-1.5, t + 1, None)] for t in ids]
    if prompt_ids is not None:
        meta["input_token_logprobs"] = [
            (None if p == 0 else -2.0, t, None) for p, t in enumerate(prompt_ids)
        ]
        meta["input_top_logprobs"] = [
            None if p == 0 else [(-2.0, t, None)] for p, t in enumerate(prompt_ids)
        ]
    out: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out


STOP = {"type": "stop", "matched": "."}
LENGTH = {"type": "length", "length": 2}


def test_a_completion_response_counts_each_prompt_once(tokenizer: PreTrainedTokenizerBase) -> None:
    req = completion(tokenizer, prompt=["a", "b"], n=2, echo=True)
    builder = ResponseBuilder(req, MODEL, tokenizer)
    results = [
        result(" x", [5], STOP, prompt_tokens=3, cached_tokens=1),
        result(" y", [6, 7], LENGTH, prompt_tokens=3, cached_tokens=3),
        result(" z", [8], STOP, prompt_tokens=2),
        result(" w", [9], STOP, prompt_tokens=2, cached_tokens=2),
    ]
    response = Completion.model_validate(builder.response(results))
    assert response.id == req.response_id
    assert response.model == MODEL
    assert [(c.index, c.text, c.finish_reason) for c in response.choices] == [
        (0, "a x", "stop"),
        (1, "a y", "length"),
        (2, "b z", "stop"),
        (3, "b w", "stop"),
    ]
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (5, 5)
    assert response.usage.total_tokens == 10
    assert response.usage.prompt_tokens_details is not None
    assert response.usage.prompt_tokens_details.cached_tokens == 1


def test_completion_logprobs_with_offsets_across_chunks(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    req = completion(tokenizer, logprobs=2, stream=True)
    builder = ResponseBuilder(req, MODEL, tokenizer)
    ids = tokenizer("ab cd", add_special_tokens=False)["input_ids"]
    texts = [str(tokenizer.decode([t])) for t in ids]
    first = builder.chunk(result("".join(texts[:1]), ids[:1], None, index=0, logprobs=True))
    last = builder.chunk(result("".join(texts[1:]), ids[1:], STOP, index=0, logprobs=True))
    # The client does not validate stream chunks, and its Completion type wants a finish
    # reason: only the last chunk validates as one.
    assert first["choices"][0]["finish_reason"] is None
    logprobs = [first["choices"][0]["logprobs"], last["choices"][0]["logprobs"]]
    assert Completion.model_validate(last).choices[0].finish_reason == "stop"
    assert logprobs[0]["tokens"] + logprobs[1]["tokens"] == texts
    assert logprobs[0]["text_offset"] == [0]
    assert logprobs[1]["text_offset"] == [sum(map(len, texts[:i])) for i in range(1, len(texts))]
    assert logprobs[0]["token_logprobs"] == [-0.5]
    assert logprobs[0]["top_logprobs"] == [{texts[0]: -0.5, tokenizer.decode([ids[0] + 1]): -1.5}]


def test_chat_stream_chunks_with_roles_indexes_and_usage(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    opts = {"include_usage": True}
    req = chat(tokenizer, n=2, stream=True, stream_options=opts, logprobs=True, top_logprobs=1)
    builder = ResponseBuilder(req, MODEL, tokenizer)
    news = [
        result("He", [40], None, index=1, logprobs=True),
        result("Hi", [41], None, index=0, logprobs=True, cached_tokens=2),
        result("y", [42], LENGTH, index=1, logprobs=True, completion_tokens=2),
        result("!", [43], STOP, index=0, logprobs=True, cached_tokens=2, completion_tokens=2),
    ]
    chunks = [ChatCompletionChunk.model_validate(builder.chunk(r)) for r in news]
    got = [
        (
            c.choices[0].index,
            c.choices[0].delta.role,
            c.choices[0].delta.content,
            c.choices[0].finish_reason,
        )
        for c in chunks
    ]
    assert got == [
        (1, "assistant", "He", None),
        (0, "assistant", "Hi", None),
        (1, None, "y", "length"),
        (0, None, "!", "stop"),
    ]
    assert all(c.id == req.response_id and c.object == "chat.completion.chunk" for c in chunks)
    content = chunks[0].choices[0].logprobs
    assert content is not None
    assert content.content is not None
    token = tokenizer.decode([40])
    assert content.content[0].token == token
    assert content.content[0].bytes == list(token.encode())
    assert [t.token for t in content.content[0].top_logprobs][:1] == [token]
    usage_chunk = builder.usage_chunk()
    assert usage_chunk is not None
    usage = ChatCompletionChunk.model_validate(usage_chunk)
    assert usage.choices == []
    assert usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (4, 4)
    assert usage.usage.prompt_tokens_details is not None
    assert usage.usage.prompt_tokens_details.cached_tokens == 2


def test_a_chat_response(tokenizer: PreTrainedTokenizerBase) -> None:
    req = chat(tokenizer)
    builder = ResponseBuilder(req, MODEL, tokenizer)
    response = ChatCompletion.model_validate(builder.response([result("Hello", [7], STOP)]))
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == "Hello"
    assert response.choices[0].logprobs is None
    assert builder.usage_chunk() is None


def test_echo_logprobs_start_with_the_prompt(tokenizer: PreTrainedTokenizerBase) -> None:
    prompt_ids = tokenizer("hi")["input_ids"]
    prompt_texts = [str(tokenizer.decode([t])) for t in prompt_ids]
    ids = tokenizer("ab cd", add_special_tokens=False)["input_ids"]
    texts = [str(tokenizer.decode([t])) for t in ids]
    req = completion(tokenizer, echo=True, logprobs=1)
    whole = ResponseBuilder(req, MODEL, tokenizer).response(
        [result("".join(texts), ids, STOP, logprobs=True, prompt_ids=prompt_ids)]
    )
    # The client's Completion type has no room for OpenAI's null first prompt logprob (the
    # client does not validate responses): the dict is checked as it is.
    (choice,) = whole["choices"]
    assert choice["text"] == "hi" + "".join(texts)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == prompt_texts + texts
    prompt_logprobs = [None] + [-2.0] * (len(prompt_ids) - 1)
    assert logprobs["token_logprobs"] == prompt_logprobs + [-0.5] * len(ids)
    assert logprobs["top_logprobs"][:2] == [None, {prompt_texts[1]: -2.0}]
    all_texts = prompt_texts + texts
    assert logprobs["text_offset"] == [sum(map(len, all_texts[:i])) for i in range(len(all_texts))]
    # Streamed: the prompt's tokens come with the echo in the choice's first chunk.
    req = completion(tokenizer, echo=True, logprobs=1, stream=True)
    stream = ResponseBuilder(req, MODEL, tokenizer)
    first = stream.chunk(result(texts[0], ids[:1], None, logprobs=True, prompt_ids=prompt_ids))
    last = stream.chunk(result("".join(texts[1:]), ids[1:], STOP, logprobs=True, prompt_ids=[]))
    parts = [first["choices"][0], last["choices"][0]]
    assert parts[0]["text"] + parts[1]["text"] == choice["text"]
    assert {k: parts[0]["logprobs"][k] + parts[1]["logprobs"][k] for k in logprobs} == logprobs


def test_logprobs_zero_with_echo_have_no_alternatives(tokenizer: PreTrainedTokenizerBase) -> None:
    builder = ResponseBuilder(completion(tokenizer, echo=True, logprobs=0), MODEL, tokenizer)
    prompt = result("x", [7], STOP, logprobs=True, prompt_ids=[1, 5, 6])
    del prompt["meta_info"]["input_top_logprobs"]  # SGLang leaves them out for 0 alternatives
    prompt["meta_info"]["output_top_logprobs"] = [[]]
    logprobs = builder.response([prompt])["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [None, {}, {}, {}]
    assert logprobs["token_logprobs"] == [None, -2.0, -2.0, -0.5]


def test_an_aborted_request_ends_with_finish_reason_abort(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    aborted = {"type": "abort", "message": "aborted by an operator"}
    builder = ResponseBuilder(chat(tokenizer, stream=True), MODEL, tokenizer)
    # "abort" is SGLang's and vLLM's finish reason, outside the client's types (which it does
    # not validate responses against).
    (choice,) = builder.chunk(result("Hi", [7], aborted))["choices"]
    assert (choice["delta"]["content"], choice["finish_reason"]) == ("Hi", "abort")
    builder = ResponseBuilder(completion(tokenizer, n=2), MODEL, tokenizer)
    whole = builder.response([result(" x", [5], STOP), result(" y", [6], aborted)])
    assert [(c["text"], c["finish_reason"]) for c in whole["choices"]] == [
        (" x", "stop"),
        (" y", "abort"),
    ]
    assert whole["usage"]["completion_tokens"] == 2


def test_a_refused_request_is_its_error(tokenizer: PreTrainedTokenizerBase) -> None:
    builder = ResponseBuilder(chat(tokenizer, stream=True), MODEL, tokenizer)
    bad = {"type": "abort", "message": "the prompt cannot fit", "status_code": 400}
    with pytest.raises(ApiError) as info:
        builder.chunk(result("", [], bad, index=0))
    assert (info.value.status, info.value.message) == (400, "the prompt cannot fit")
    refused_ = {"type": "abort", "message": "the queue is full", "status_code": 429}
    with pytest.raises(ApiError) as info:
        ResponseBuilder(completion(tokenizer), MODEL, tokenizer).response(
            [result("", [], refused_)]
        )
    assert info.value.status == 429
