"""The gRPC entrance's messages, without a server: a `GenerateRequest` becomes the native
request it stands for (proto3's zeros read as SGLang's defaults where zero is out of range,
unsupported features refused naming their field), and results become chunks and completions
that together carry every id, logprob and finish detail; the API key is read as the HTTP
entrance reads it."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from srt.entrypoints.grpc import proto
from srt.entrypoints.grpc.auth import ApiKeyInterceptor
from srt.entrypoints.grpc.requests import generate_input, grpc_field
from srt.entrypoints.grpc.responses import ResponseBuilder, refusal
from srt.managers.generate_req_input import expand
from srt.request_limits import RequestError, RequestLimits
from srt.server_args import ServerArgs

pb = proto.load()


def request(**sampling: Any) -> Any:
    return pb.GenerateRequest(
        request_id="r1",
        tokenized=pb.TokenizedInput(input_ids=[5, 6, 7]),
        sampling_params=pb.SamplingParams(**sampling),
        stream=True,
    )


def test_a_request_maps_onto_the_native_one() -> None:
    obj = generate_input(
        request(
            temperature=0.0,
            max_new_tokens=9,
            stop=["END"],
            stop_token_ids=[3],
            ebnf_grammar='root ::= "a"',
            logit_bias={"12": -1.5},
            skip_special_tokens=True,
        )
    )
    assert (obj.input_ids, obj.rid, obj.stream) == ([5, 6, 7], "r1", True)
    (req,) = expand(obj, RequestLimits.of(ServerArgs()))
    params = req.sampling_kwargs
    assert params["temperature"] == 0.0  # greedy, as given
    assert (params["top_p"], params["top_k"], params["repetition_penalty"]) == (1.0, -1, 1.0)
    assert (params["max_new_tokens"], params["stop"], params["stop_token_ids"]) == (
        9,
        ("END",),
        (3,),
    )
    assert params["ebnf"] == 'root ::= "a"'
    assert params["logit_bias"] == ((12, -1.5),)
    unset = generate_input(request(temperature=1.0))
    (req,) = expand(unset, RequestLimits.of(ServerArgs()))
    assert req.sampling_kwargs["max_new_tokens"] is None  # up to the context length
    no_params = pb.GenerateRequest(request_id="r2", tokenized=pb.TokenizedInput(input_ids=[1]))
    assert generate_input(no_params).sampling_params == {}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"mm_inputs": pb.MultimodalInputs(image_urls=["x"])}, "mm_inputs"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"lora_id": "a"}, "lora_id"),
        ({"token_ids_logprob": [1]}, "token_ids_logprob"),
        ({"request_id": ""}, "request_id"),
    ],
)
def test_unsupported_request_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    message = request(temperature=1.0)
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(message, name).extend(value)
        elif hasattr(value, "CopyFrom"):
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)
    with pytest.raises(RequestError) as refused:
        generate_input(message)
    assert refused.value.param == param


def test_unsupported_sampling_fields_and_a_missing_prompt_are_refused() -> None:
    with pytest.raises(RequestError) as refused:
        generate_input(request(structural_tag="{}"))
    assert refused.value.param == "sampling_params.structural_tag"
    with pytest.raises(RequestError) as refused:
        generate_input(pb.GenerateRequest(request_id="r"))
    assert refused.value.param == "tokenized"


def test_native_field_names_become_the_services() -> None:
    assert grpc_field("input_ids") == "tokenized.input_ids"
    assert grpc_field("sampling_params.ebnf") == "sampling_params.ebnf_grammar"
    assert grpc_field("sampling_params.top_p") == "sampling_params.top_p"
    assert grpc_field(None) is None


def result(ids: list[int], reason: dict[str, Any] | None, **meta: Any) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "prompt_tokens": 3,
            "completion_tokens": meta.pop("completion_tokens", len(ids)),
            "cached_tokens": 1,
            "finish_reason": reason,
            **meta,
        },
    }


def test_a_stream_carries_every_id_and_logprob_once() -> None:
    builder = ResponseBuilder(pb, "r1", return_logprob=True)
    first = result(
        [4, 5],
        None,
        output_token_logprobs=[(-0.5, 4, None), (-0.25, 5, None)],
        output_top_logprobs=[[(-0.5, 4, None)], [(-0.25, 5, None)]],
        input_token_logprobs=[(None, 5, None), (-1.0, 6, None)],
    )
    last = result(
        [9],
        {"type": "stop", "matched": 9},
        completion_tokens=3,
        output_token_logprobs=[(-2.0, 9, None)],
        output_top_logprobs=[[(-2.0, 9, None)]],
    )
    chunk = builder.chunk(first, 0).chunk
    assert list(chunk.token_ids) == [4, 5]
    assert list(chunk.output_logprobs.token_logprobs) == [-0.5, -0.25]
    assert not chunk.input_logprobs.token_logprobs[0].HasField("value")  # position 0 has none
    assert chunk.input_logprobs.token_logprobs[1].value == -1.0
    assert list(builder.chunk(last, 0).chunk.token_ids) == [9]
    done = builder.complete(last, 0, streamed=True)
    assert done.request_id == "r1"
    complete = done.complete
    assert list(complete.output_ids) == [4, 5, 9]
    assert list(complete.output_logprobs.token_logprobs) == [-0.5, -0.25, -2.0]
    assert [list(t.token_ids) for t in complete.output_logprobs.top_logprobs] == [[4], [5], [9]]
    assert (complete.finish_reason, complete.matched_token_id) == ("stop", 9)
    assert (complete.prompt_tokens, complete.completion_tokens, complete.cached_tokens) == (3, 3, 1)


def test_a_final_result_completes_alone() -> None:
    builder = ResponseBuilder(pb, "r1", return_logprob=False)
    done = builder.complete(result([1, 2], {"type": "stop", "matched": "END"}), 1, streamed=False)
    complete = done.complete
    assert (list(complete.output_ids), complete.index) == ([1, 2], 1)
    assert complete.WhichOneof("matched_stop") == "matched_stop_str"
    assert complete.matched_stop_str == "END"
    assert builder.trailing_metadata() == ()  # no stage times in the results
    timed = result([1], {"type": "length", "length": 1}, stage_latencies={"decode": 0.5})
    length = builder.complete(timed, 0, streamed=False)
    assert length.complete.finish_reason == "length"
    assert length.complete.WhichOneof("matched_stop") is None
    ((key, value),) = builder.trailing_metadata()
    assert (key, json.loads(value)) == ("srt-stage-latencies", {"0": {"decode": 0.5}})


def test_a_schedulers_refusal_is_a_status_naming_the_field() -> None:
    assert refusal({"type": "abort", "message": "client gone"}) is None  # not a refusal
    assert refusal({"type": "length", "length": 3}) is None
    full = {"type": "abort", "message": "the queue is full", "status_code": 429}
    assert refusal(full) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue is full")
    bad = {"type": "abort", "message": "bad", "status_code": 400, "param": "x.y"}
    assert refusal(bad) == (grpc.StatusCode.INVALID_ARGUMENT, "x.y: bad")


def test_the_api_key_is_read_from_either_metadata_entry() -> None:
    check = ApiKeyInterceptor("sekret")
    assert check.allows([("authorization", "Bearer sekret")])
    assert check.allows([("x-api-key", "sekret"), ("authorization", "Bearer other")])
    assert check.allows([("user-agent", "x"), ("x-api-key", b"sekret")])
    assert not check.allows([("authorization", "Basic sekret")])
    assert not check.allows([("authorization", "Bearer sekret2")])
    assert not check.allows([])
    assert not check.allows(None)
