"""Client requests into per-output requests: batches, `n` samples, ids, and every bad input."""

from __future__ import annotations

from typing import Any

import pytest

from srt.managers.generate_req_input import GenerateReqInput, expand, sampling_kwargs
from srt.request_limits import INT64_MAX, RequestError, RequestLimits
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs

LIMITS = RequestLimits.of(ServerArgs())


def test_one_prompt_is_one_request_with_a_fresh_id() -> None:
    obj = GenerateReqInput(text="hi", sampling_params={"max_new_tokens": 4})
    (a,) = expand(obj, LIMITS)
    (b,) = expand(obj, LIMITS)
    assert obj.is_single
    assert (a.index, a.text, a.input_ids, a.sampling_kwargs) == (
        0,
        "hi",
        None,
        {"max_new_tokens": 4},
    )
    assert a.rid
    assert a.rid != b.rid


def test_a_batch_with_n_samples_is_prompt_major_with_derived_ids_and_seeds() -> None:
    obj = GenerateReqInput(
        input_ids=[[1, 2], [3]],
        sampling_params=[{"n": 2, "seed": 7}, {"n": 1}],
        rid=["a", "b"],
        return_logprob=[True, False],
        logprob_start_len=[1, 0],
        stream=True,
    )
    reqs = expand(obj, LIMITS)
    assert not obj.is_single
    assert [(r.index, r.rid, r.input_ids) for r in reqs] == [
        (0, "a-0", [1, 2]),
        (1, "a-1", [1, 2]),
        (2, "b", [3]),
    ]
    assert [r.sampling_kwargs.get("seed") for r in reqs] == [7, 8, None]
    assert [r.return_logprob for r in reqs] == [True, True, False]
    assert [r.logprob_start_len for r in reqs] == [1, 1, -1]  # without logprobs: none
    assert all(r.stream for r in reqs)


def test_a_single_id_list_is_one_prompt() -> None:
    obj = GenerateReqInput(input_ids=[5, 6, 7])
    assert obj.is_single
    assert [r.input_ids for r in expand(obj, LIMITS)] == [[5, 6, 7]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of text and input_ids"),
        ({"text": "a", "input_ids": [1]}, "exactly one of text and input_ids"),
        ({"text": []}, "no prompt"),
        ({"text": ["a", 3]}, "list of strings"),
        ({"input_ids": [[1], [-2]]}, r"integer token ids in \[0, 2147483647\]"),
        ({"input_ids": [[1], [True]]}, r"integer token ids in \[0, 2147483647\]"),
        ({"input_ids": "12"}, "list of token ids"),
        ({"text": ["a", "b"], "rid": "x"}, "list of rids"),
        ({"text": ["a", "b"], "rid": ["x"]}, "rid has 1 entries for 2 prompts"),
        ({"text": "a", "rid": ""}, "rid must be a non-empty string"),
        ({"text": "a", "sampling_params": [{}, {}]}, "2 entries for 1 prompts"),
        ({"text": "a", "sampling_params": "hot"}, "sampling_params must be a mapping"),
        ({"text": "a", "return_logprob": 1}, "return_logprob must be a boolean"),
        ({"text": "a", "top_logprobs_num": -1}, "top_logprobs_num must be an int >= 0"),
        ({"text": "a", "logprob_start_len": -2}, "logprob_start_len must be an int >= -1"),
        ({"text": "a", "logprob_start_len": 1.5}, "logprob_start_len must be an int >= -1"),
        ({"text": "a", "stream": "yes"}, "stream must be a boolean"),
        ({"text": "a", "sampling_params": {"n": 0}}, "n must be >= 1"),
    ],
)
def test_malformed_requests_are_refused_with_a_clear_error(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        expand(GenerateReqInput(**kwargs), LIMITS)


def test_sampling_parameters_take_json_shapes() -> None:
    kwargs = sampling_kwargs(
        {
            "stop": "###",
            "stop_token_ids": [3, 4],
            "logit_bias": {"17": 2, 5: -1.5},
            "temperature": 0,
            "max_new_tokens": None,
            "seed": None,
        },
        LIMITS,
    )
    assert kwargs == {
        "stop": ("###",),
        "stop_token_ids": (3, 4),
        "logit_bias": ((17, 2.0), (5, -1.5)),
        "temperature": 0.0,
        "max_new_tokens": None,
        "seed": None,
    }
    kwargs["max_new_tokens"] = 8
    assert SamplingParams(**kwargs).is_greedy


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"temprature": 0.5}, "unknown sampling parameter 'temprature'"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"max_new_tokens": 1.5}, "max_new_tokens must be an integer"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
        ({"ignore_eos": 1}, "ignore_eos must be true or false"),
        ({"stop": ["a", 1]}, "stop must be a string or a list of strings"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids must be a list of token ids"),
        ({"logit_bias": {"x": 1}}, "logit_bias must be keyed by token ids"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a mapping"),
    ],
)
def test_bad_sampling_parameters_are_named(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampling_kwargs(raw, LIMITS)


# ---- limits and integer ranges -------------------------------------------------------------

SMALL = RequestLimits(
    max_n=4,
    max_client_batch_size=3,
    max_samples_per_request=6,
    max_stop_sequences=2,
    max_stop_sequence_length=5,
    max_logprobs=3,
    max_logit_bias_entries=2,
)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"text": "a", "sampling_params": {"n": 5}}, "sampling_params.n"),
        ({"text": ["a", "b", "c", "d"]}, "text"),
        ({"input_ids": [[1], [2], [3], [4]]}, "input_ids"),
        ({"text": ["a", "b"], "sampling_params": {"n": 4}}, "sampling_params.n"),
        ({"text": "a", "sampling_params": {"stop": ["a", "b", "c"]}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop": "abcdef"}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop_token_ids": [1, 2, 3]}},
         "sampling_params.stop_token_ids"),
        ({"text": "a", "sampling_params": {"logit_bias": {"1": 1, "2": 1, "3": 1}}},
         "sampling_params.logit_bias"),
        ({"text": "a", "top_logprobs_num": 4}, "top_logprobs_num"),
        ({"text": ["a", "b"], "top_logprobs_num": [0, 4]}, "top_logprobs_num"),
    ],
)  # fmt: skip
def test_sizes_beyond_the_limits_are_refused_naming_the_field(
    kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as info:
        expand(GenerateReqInput(**kwargs), SMALL)
    assert info.value.param == param


def test_sizes_at_the_limits_pass() -> None:
    obj = GenerateReqInput(
        text=["a", "b", "c"],
        sampling_params={"n": 2, "stop": ["abcde", "x"], "logit_bias": {"1": 1, "2": 1}},
        top_logprobs_num=3,
    )
    assert len(expand(obj, SMALL)) == 6


def test_a_huge_n_is_refused_by_the_default_limits() -> None:
    obj = GenerateReqInput(text="a", sampling_params={"n": 400_000})
    with pytest.raises(RequestError, match="at most 128") as info:
        expand(obj, LIMITS)
    assert info.value.param == "sampling_params.n"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"sampling_params": {"top_k": 2**63}}, "sampling_params.top_k"),
        ({"sampling_params": {"seed": 2**63}}, "sampling_params.seed"),
        ({"sampling_params": {"seed": -1}}, "sampling_params.seed"),
        ({"sampling_params": {"max_new_tokens": 2**63}}, "sampling_params.max_new_tokens"),
        ({"sampling_params": {"min_new_tokens": -(2**63) - 1}}, "sampling_params.min_new_tokens"),
        ({"sampling_params": {"stop_token_ids": [2**31]}}, "sampling_params.stop_token_ids"),
        ({"sampling_params": {"logit_bias": {str(2**31): 1}}}, "sampling_params.logit_bias"),
        ({"sampling_params": {"logit_bias": {2**64: 1}}}, "sampling_params.logit_bias"),
        ({"sampling_params": {"logit_bias": {"9" * 5000: 1}}}, "sampling_params.logit_bias"),
        ({"sampling_params": {"logit_bias": {"\u00b2": 1}}}, "sampling_params.logit_bias"),
        ({"sampling_params": {"temperature": 10**400}}, "sampling_params.temperature"),
        ({"top_logprobs_num": 2**63}, "top_logprobs_num"),
        ({"logprob_start_len": 2**63}, "logprob_start_len"),
        ({"input_ids": [1, 2**31], "text": None}, "input_ids"),
    ],
)
def test_integers_out_of_range_are_refused_naming_the_field(
    kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(RequestError) as info:
        expand(GenerateReqInput(**{"text": "a", **kwargs}), LIMITS)
    assert info.value.param == param


def test_sample_seeds_wrap_within_the_seed_range() -> None:
    obj = GenerateReqInput(text="a", sampling_params={"n": 2, "seed": INT64_MAX})
    assert [r.sampling_kwargs["seed"] for r in expand(obj, LIMITS)] == [INT64_MAX, 0]
