"""OpenAI bodies into generate inputs, checked by the tokenizer manager's one validation path
(every bad field a 400 naming it as the body does); the responses are tested in
test_openai_responses.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.openai_api import openai_errors
from srt.entrypoints.http.openai_protocol import (
    JSON_OBJECT_SCHEMA,
    OpenAIRequest,
    parse_chat_request,
    parse_completion_request,
)
from srt.managers.generate_req_input import expand
from srt.managers.request_tokenizer import RequestTokenizer
from srt.request_limits import RequestLimits
from srt.server_args import ServerArgs

MODEL = "tiny"
LIMITS = RequestLimits.of(ServerArgs())


@pytest.fixture(scope="module")
def tokenizer(tiny_model_factory: Callable[[str], Path]) -> RequestTokenizer:
    """The tokenizer manager's checks, on the tiny llama model."""
    return RequestTokenizer(ServerArgs(model_path=str(tiny_model_factory("llama"))))


def checked(tokenizer: RequestTokenizer, req: OpenAIRequest, limits: RequestLimits) -> Any:
    """`req` as the tokenizer manager accepts it: its errors named as the body names them."""
    with openai_errors(req):
        tokenizer.tokenize(expand(req.obj, limits))
    return req


def completion(tokenizer: RequestTokenizer, limits: RequestLimits = LIMITS, **fields: Any) -> Any:
    body = {"model": MODEL, "prompt": "hi", **fields}
    return checked(tokenizer, parse_completion_request(body, MODEL), limits)


def chat(tokenizer: RequestTokenizer, **fields: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    return checked(tokenizer, parse_chat_request(body, MODEL), LIMITS)


def refused(call: Callable[[], Any], param: str | None, status: int = 400) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    assert (info.value.status, info.value.param) == (status, param), info.value.message
    return info.value


# ---- requests ------------------------------------------------------------------------------


def test_completion_fields_map_to_sglang_sampling_names(tokenizer: RequestTokenizer) -> None:
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
    reqs = expand(req.obj, LIMITS)
    assert [r.rid for r in reqs] == [f"{req.response_id}-0", f"{req.response_id}-1"]
    assert [r.sampling_kwargs["seed"] for r in reqs] == [3, 4]


def test_no_max_tokens_means_up_to_the_context(tokenizer: RequestTokenizer) -> None:
    assert completion(tokenizer).obj.sampling_params == {"max_new_tokens": None}
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
    tokenizer: RequestTokenizer, prompt: Any, texts: Any, ids: Any
) -> None:
    req = completion(tokenizer, prompt=prompt, n=2)
    assert (req.obj.text, req.obj.input_ids) == (texts, ids)
    assert len(expand(req.obj, LIMITS)) == 2 * len(texts or ids)


@pytest.mark.parametrize(
    "prompt", ["", [], [""], [[]], [1, "a"], [[1], "a"], [-1], [1.5], None, 3, [True]]
)
def test_bad_prompts(tokenizer: RequestTokenizer, prompt: Any) -> None:
    refused(lambda: completion(tokenizer, prompt=prompt), "prompt")


def test_echo_asks_for_the_prompt_text(tokenizer: RequestTokenizer) -> None:
    assert completion(tokenizer, prompt=["a", "b"], echo=True).echo
    assert not completion(tokenizer).echo


def test_the_model_must_be_the_served_one(tokenizer: RequestTokenizer) -> None:
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
    tokenizer: RequestTokenizer, field: str, value: Any
) -> None:
    refused(lambda: completion(tokenizer, **{field: value}), field)


def test_min_tokens_beyond_max_tokens(tokenizer: RequestTokenizer) -> None:
    refused(lambda: completion(tokenizer, min_tokens=5, max_tokens=2), "min_tokens")


def test_echo_with_logprobs_asks_for_the_prompt_logprobs(
    tokenizer: RequestTokenizer,
) -> None:
    assert completion(tokenizer, echo=True, logprobs=1).obj.logprob_start_len == 0
    assert completion(tokenizer, echo=True, logprobs=0).obj.logprob_start_len == 0
    assert completion(tokenizer, echo=True).obj.logprob_start_len == -1
    assert completion(tokenizer, logprobs=1).obj.logprob_start_len == -1


def test_stream_options(tokenizer: RequestTokenizer) -> None:
    opts = {"include_usage": True}
    assert completion(tokenizer, stream=True, stream_options=opts).include_usage
    assert not completion(tokenizer, stream=True).include_usage
    bad = {"include_usage": 1}
    refused(lambda: completion(tokenizer, stream=True, stream_options=bad), "stream_options")
    odd = {"other": True}
    refused(lambda: completion(tokenizer, stream=True, stream_options=odd), "stream_options")


def test_chat_messages_map_onto_template_messages_rendered_once_without_a_second_bos(
    tokenizer: RequestTokenizer,
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
    mapped = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi !"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert req.chat
    assert req.response_id.startswith("chatcmpl-")
    assert req.obj.messages == mapped
    assert req.obj.sampling_params["max_new_tokens"] == 3
    reqs = expand(req.obj, LIMITS)
    assert [r.rid for r in reqs] == [req.response_id]
    (tokenized,) = tokenizer.tokenize(reqs)
    text = tokenizer.tokenizer.apply_chat_template(mapped, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = list(tokenized.input_ids)
    assert ids == tokenizer.tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] != tokenizer.tokenizer.encode("")[0]  # the BOS the tiny llama's encoding adds


def test_chat_logprobs(tokenizer: RequestTokenizer) -> None:
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
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]},
            "messages[0].tool_calls[0]",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_object"}, "json_schema": "{}"}, "response_format"),
        ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
        ({"regex": "a("}, "regex"),
        ({"ebnf": "no start rule"}, "ebnf"),
        ({"json_schema": "{not json"}, "json_schema"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"max_tokens": 2, "max_completion_tokens": 3}, "max_tokens"),
        ({"max_completion_tokens": -2}, "max_completion_tokens"),
        ({"echo": True}, "echo"),
    ],
)
def test_bad_chat_requests(tokenizer: RequestTokenizer, fields: dict[str, Any], param: str) -> None:
    refused(lambda: chat(tokenizer, **fields), param)


def test_response_format_maps_onto_json_schema(tokenizer: RequestTokenizer) -> None:
    def schema_of(call: Callable[..., Any], **fields: Any) -> Any:
        params = call(tokenizer, **fields).obj.sampling_params
        return params.get("json_schema"), params.get("regex")

    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    named = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for call in (chat, completion):
        assert schema_of(call, response_format=named) == (json.dumps(schema), None)
        assert schema_of(call, response_format={"type": "json_object"}) == (
            JSON_OBJECT_SCHEMA,
            None,
        )
        assert schema_of(call, response_format={"type": "text"}) == (None, None)
        assert schema_of(call, regex="[0-9]+") == (None, "[0-9]+")


def test_a_model_without_a_chat_template(tokenizer: RequestTokenizer) -> None:
    template = tokenizer.tokenizer.chat_template
    tokenizer.tokenizer.chat_template = None
    try:
        error = refused(lambda: chat(tokenizer), "messages")
    finally:
        tokenizer.tokenizer.chat_template = template
    assert "/v1/completions" in error.message


# ---- limits and integer ranges -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ["p"] * 129}, "prompt"),
        ({"prompt": [[1]] * 129}, "prompt"),
        ({"prompt": ["p"] * 9, "n": 128}, "n"),  # 1152 samples
        ({"stop": ["s"] * 33}, "stop"),
        ({"stop": "s" * 1025}, "stop"),
        ({"stop_token_ids": [1] * 33}, "stop_token_ids"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
        ({"logprobs": 2**63}, "logprobs"),
        ({"top_k": 2**63}, "top_k"),
        ({"seed": 2**64 - 1}, "seed"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"min_tokens": 2**63}, "min_tokens"),
        ({"n": 2**63}, "n"),
        ({"stop_token_ids": [2**31]}, "stop_token_ids"),
        ({"logit_bias": {str(2**32): 1}}, "logit_bias"),
        ({"prompt": [2**31]}, "prompt"),
        ({"prompt": [[1], [2**63]]}, "prompt"),
        ({"prompt": [2**32], "echo": True}, "prompt"),
        ({"prompt": [2**31 - 1], "echo": True}, "prompt"),  # fits int32, not the vocabulary
    ],
)
def test_completion_sizes_and_integers_out_of_range_name_their_field(
    tokenizer: RequestTokenizer, fields: dict[str, Any], param: str
) -> None:
    refused(lambda: completion(tokenizer, **fields), param)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 2**63}, "top_logprobs"),
        ({"max_completion_tokens": 2**63}, "max_completion_tokens"),
        ({"seed": 2**63}, "seed"),
        ({"n": 129}, "n"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ],
)
def test_chat_sizes_and_integers_out_of_range_name_their_field(
    tokenizer: RequestTokenizer, fields: dict[str, Any], param: str
) -> None:
    refused(lambda: chat(tokenizer, **fields), param)


def test_the_limits_are_the_servers(tokenizer: RequestTokenizer) -> None:
    limits = RequestLimits.of(ServerArgs(max_n=2, max_logprobs=1, max_client_batch_size=2))
    body: dict[str, Any] = {"prompt": ["a", "b"], "n": 2, "logprobs": 1}
    assert completion(tokenizer, limits, **body).n == 2
    for field, value in (("n", 3), ("logprobs", 2), ("prompt", ["a", "b", "c"])):
        bad = {**body, field: value}
        refused(lambda: completion(tokenizer, limits, **bad), field)  # noqa: B023


@pytest.mark.parametrize(
    ("native", "chat_param", "completion_param"),
    [
        ("sampling_params.max_new_tokens", "max_completion_tokens", "max_tokens"),
        ("sampling_params.min_new_tokens", "min_tokens", "min_tokens"),
        ("sampling_params.logit_bias", "logit_bias", "logit_bias"),
        ("input_ids", "messages", "prompt"),
        ("top_logprobs_num", "top_logprobs", "logprobs"),
        ("rid", None, None),
        (None, None, None),
    ],
)
def test_native_field_names_map_to_the_body_fields(
    tokenizer: RequestTokenizer,
    native: str | None,
    chat_param: str | None,
    completion_param: str | None,
) -> None:
    assert chat(tokenizer, max_completion_tokens=5).param_of(native) == chat_param
    assert completion(tokenizer).param_of(native) == completion_param
