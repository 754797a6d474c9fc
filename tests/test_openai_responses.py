"""SGLang-shaped results into OpenAI responses and stream chunks (`openai_responses`), checked
against the `openai` client's own types where OpenAI's shape fits them."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from test_openai_protocol import MODEL, chat, completion, tokenizer

from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.openai_responses import ResponseBuilder
from srt.managers.request_tokenizer import RequestTokenizer

__all__ = ["tokenizer"]  # the fixture, shared with the request tests


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


def test_a_completion_response_counts_each_prompt_once(tokenizer: RequestTokenizer) -> None:
    req = completion(tokenizer, prompt=["a", "b"], n=2, echo=True)
    builder = ResponseBuilder(req, MODEL, tokenizer.tokenizer)
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
    tokenizer: RequestTokenizer,
) -> None:
    req = completion(tokenizer, logprobs=2, stream=True)
    builder = ResponseBuilder(req, MODEL, tokenizer.tokenizer)
    ids = tokenizer.tokenizer.encode("ab cd", add_special_tokens=False)
    texts = [str(tokenizer.tokenizer.decode([t])) for t in ids]
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
    assert logprobs[0]["top_logprobs"] == [
        {texts[0]: -0.5, tokenizer.tokenizer.decode([ids[0] + 1]): -1.5}
    ]


def test_chat_stream_chunks_with_roles_indexes_and_usage(
    tokenizer: RequestTokenizer,
) -> None:
    opts = {"include_usage": True}
    req = chat(tokenizer, n=2, stream=True, stream_options=opts, logprobs=True, top_logprobs=1)
    builder = ResponseBuilder(req, MODEL, tokenizer.tokenizer)
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
    token = tokenizer.tokenizer.decode([40])
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


def test_a_chat_response(tokenizer: RequestTokenizer) -> None:
    req = chat(tokenizer)
    builder = ResponseBuilder(req, MODEL, tokenizer.tokenizer)
    response = ChatCompletion.model_validate(builder.response([result("Hello", [7], STOP)]))
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == "Hello"
    assert response.choices[0].logprobs is None
    assert builder.usage_chunk() is None


def test_echo_logprobs_start_with_the_prompt(tokenizer: RequestTokenizer) -> None:
    prompt_ids = tokenizer.tokenizer.encode("hi")
    prompt_texts = [str(tokenizer.tokenizer.decode([t])) for t in prompt_ids]
    ids = tokenizer.tokenizer.encode("ab cd", add_special_tokens=False)
    texts = [str(tokenizer.tokenizer.decode([t])) for t in ids]
    req = completion(tokenizer, echo=True, logprobs=1)
    whole = ResponseBuilder(req, MODEL, tokenizer.tokenizer).response(
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
    stream = ResponseBuilder(req, MODEL, tokenizer.tokenizer)
    first = stream.chunk(result(texts[0], ids[:1], None, logprobs=True, prompt_ids=prompt_ids))
    last = stream.chunk(result("".join(texts[1:]), ids[1:], STOP, logprobs=True, prompt_ids=[]))
    parts = [first["choices"][0], last["choices"][0]]
    assert parts[0]["text"] + parts[1]["text"] == choice["text"]
    assert {k: parts[0]["logprobs"][k] + parts[1]["logprobs"][k] for k in logprobs} == logprobs


def test_logprobs_zero_with_echo_have_no_alternatives(tokenizer: RequestTokenizer) -> None:
    builder = ResponseBuilder(
        completion(tokenizer, echo=True, logprobs=0), MODEL, tokenizer.tokenizer
    )
    prompt = result("x", [7], STOP, logprobs=True, prompt_ids=[1, 5, 6])
    del prompt["meta_info"]["input_top_logprobs"]  # SGLang leaves them out for 0 alternatives
    prompt["meta_info"]["output_top_logprobs"] = [[]]
    logprobs = builder.response([prompt])["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [None, {}, {}, {}]
    assert logprobs["token_logprobs"] == [None, -2.0, -2.0, -0.5]


def test_an_aborted_request_ends_with_finish_reason_abort(
    tokenizer: RequestTokenizer,
) -> None:
    aborted = {"type": "abort", "message": "aborted by an operator"}
    builder = ResponseBuilder(chat(tokenizer, stream=True), MODEL, tokenizer.tokenizer)
    # "abort" is SGLang's and vLLM's finish reason, outside the client's types (which it does
    # not validate responses against).
    (choice,) = builder.chunk(result("Hi", [7], aborted))["choices"]
    assert (choice["delta"]["content"], choice["finish_reason"]) == ("Hi", "abort")
    builder = ResponseBuilder(completion(tokenizer, n=2), MODEL, tokenizer.tokenizer)
    whole = builder.response([result(" x", [5], STOP), result(" y", [6], aborted)])
    assert [(c["text"], c["finish_reason"]) for c in whole["choices"]] == [
        (" x", "stop"),
        (" y", "abort"),
    ]
    assert whole["usage"]["completion_tokens"] == 2


def test_a_refused_request_is_its_error(tokenizer: RequestTokenizer) -> None:
    builder = ResponseBuilder(chat(tokenizer, stream=True), MODEL, tokenizer.tokenizer)
    bad = {"type": "abort", "message": "the prompt cannot fit", "status_code": 400}
    with pytest.raises(ApiError) as info:
        builder.chunk(result("", [], bad, index=0))
    assert (info.value.status, info.value.message) == (400, "the prompt cannot fit")
    refused_ = {"type": "abort", "message": "the queue is full", "status_code": 429}
    with pytest.raises(ApiError) as info:
        ResponseBuilder(completion(tokenizer), MODEL, tokenizer.tokenizer).response(
            [result("", [], refused_)]
        )
    assert info.value.status == 429
