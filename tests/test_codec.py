"""The codec round-trips every cross-process message and rejects every malformed frame."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srt.io_struct import (
    MESSAGE_TYPES,
    BatchTokenIDOut,
    DetokenizeSettings,
    FinishReason,
    TokenizedGenerateReq,
)
from srt.ipc.codec import CodecError, decode, encode, message_type
from srt.sampling_params import SamplingParams

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False)

SAMPLING_PARAMS = st.builds(
    SamplingParams,
    max_new_tokens=st.integers(1, 4096),
    min_new_tokens=st.just(0),
    stop=st.lists(st.text(min_size=1), max_size=3).map(tuple),
    stop_token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=4).map(tuple),
    temperature=st.floats(0, 2),
    top_p=st.floats(0.01, 1),
    top_k=st.sampled_from([-1, 1, 50]),
    min_p=st.floats(0, 1),
    frequency_penalty=st.floats(-2, 2),
    presence_penalty=st.floats(-2, 2),
    repetition_penalty=st.floats(0.01, 2),
    ignore_eos=st.booleans(),
    seed=st.none() | INT64,
    logit_bias=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.floats(-100, 100))).map(tuple),
)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Values of an io_struct field type; token-id tuples stay within int32."""
    if hint is SamplingParams:
        return SAMPLING_PARAMS
    simple = {int: INT64, float: FLOATS, bool: st.booleans(), str: st.text()}
    if hint in simple:
        return simple[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else strategy_for(a) for a in args))
    if origin is tuple and args[1:] == (Ellipsis,):
        item = INT32 if args[0] is int else strategy_for(args[0])
        return st.lists(item, max_size=8).map(tuple)
    if origin is tuple:
        return st.tuples(*(strategy_for(a) for a in args))
    if dataclasses.is_dataclass(hint):
        return message_strategy(hint)  # type: ignore[arg-type]
    raise TypeError(hint)


def message_strategy(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_message_round_trips(cls: type, data: st.DataObject) -> None:
    msg = data.draw(message_strategy(cls))
    frame = encode(msg)
    assert message_type(frame) is cls
    assert decode(frame) == msg


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_truncation_or_extension_is_rejected(cls: type, data: st.DataObject) -> None:
    frame = encode(data.draw(message_strategy(cls)))
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(CodecError):
        decode(frame[:cut])
    with pytest.raises(CodecError):
        decode(frame + data.draw(st.binary(min_size=1, max_size=8)))


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=200))
def test_garbage_raises_codec_error_or_decodes(frame: bytes) -> None:
    try:
        msg = decode(frame)
    except CodecError:
        return
    assert encode(msg) == frame  # a frame that decodes is a canonical encoding


def test_token_ids_are_packed_int32() -> None:
    ids = tuple(range(1000))
    params = SamplingParams()
    small = encode(TokenizedGenerateReq("r", (), params))
    big = encode(TokenizedGenerateReq("r", ids, params))
    assert len(big) - len(small) == 4 * len(ids)
    with pytest.raises(OverflowError):
        encode(TokenizedGenerateReq("r", (2**31,), params))


def test_no_pickle_and_unknown_types_refused() -> None:
    with pytest.raises(TypeError):
        encode(SamplingParams())  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        decode(bytes([len(MESSAGE_TYPES) + 1]))
    with pytest.raises(CodecError):
        decode(b"")
    out = BatchTokenIDOut(
        ("a",), ((1, 2),), (None,), (2,), (2,), (0,), (None,), ((),), ((),), ((),), ((),),
    )  # fmt: skip
    assert b"pickle" not in encode(out)
    assert encode(out)[0] == MESSAGE_TYPES.index(BatchTokenIDOut) + 1


def test_finish_reasons_and_logprobs_round_trip() -> None:
    reasons = (
        FinishReason("stop", matched_token=2),
        FinishReason("stop", matched_str="\n\n", matched_offset=5),
        FinishReason("length", length=16),
        FinishReason("abort", message="client disconnected"),
        FinishReason("abort", message="too many requests", status_code=429),
        None,
    )
    out = BatchTokenIDOut(
        rids=tuple("abcdef"),
        output_ids=((1, 2),) * 6,
        finished_reasons=reasons,
        prompt_tokens=(3,) * 6,
        completion_tokens=(2,) * 6,
        cached_tokens=(0,) * 6,
        settings=(DetokenizeSettings((7, 8, 9), True, False, ("\n\n",)),) + (None,) * 5,
        output_logprobs=((-0.5, -1.25),) * 6,
        output_top_logprobs=((((1, -0.5), (4, -2.0)), ((2, -1.25),)),) * 6,
        input_token_logprobs=((None, -3.5, -0.25),) * 6,
        input_top_logprobs=(((), ((6, -0.75),), ((3, -0.25),)),) * 6,
    )
    assert decode(encode(out)) == out
    assert [r.to_json() if r else None for r in reasons] == [
        {"type": "stop", "matched": 2},
        {"type": "stop", "matched": "\n\n"},
        {"type": "length", "length": 16},
        {"type": "abort", "message": "client disconnected"},
        {"type": "abort", "message": "too many requests", "status_code": 429},
        None,
    ]


def test_sampling_params_follow_sglang_defaults_and_ranges() -> None:
    p = SamplingParams()
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (128, 1.0, 1.0, -1, 0.0)
    assert (p.repetition_penalty, p.n, p.skip_special_tokens) == (1.0, 1, True)
    assert p.spaces_between_special_tokens
    assert not p.ignore_eos
    assert p.seed is None
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": 0}, {"min_new_tokens": 200}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)  # type: ignore[arg-type]
