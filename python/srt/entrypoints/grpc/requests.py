"""A `GenerateRequest` as srt's `GenerateReqInput`: token ids in, SGLang's sampling parameters.

The request then takes the HTTP entrance's path through the TokenizerManager (`expand`, the
request limits, `RequestTokenizer.build_req`), so the two entrances refuse the same things with
the same messages; only the field names differ, and `grpc_field` gives an error's field as this
service spells it (`tokenized.input_ids`, `sampling_params.ebnf_grammar`).

proto3 cannot tell an unset number from 0. The router sets every sampling parameter; for other
clients a 0 where 0 is out of range (`top_p`, `top_k`, `repetition_penalty`, `n`) means the
default, while `temperature` 0 is greedy, as given. Fields for features srt does not have
(multimodal inputs, hidden states, LoRA, disaggregation, structural tags, ...) are refused
unless left at their defaults, each naming the field.
"""

from __future__ import annotations

from typing import Any

from srt.managers.generate_req_input import GenerateReqInput
from srt.request_limits import RequestError

# Request fields srt refuses when set: (field, what it would ask for).
UNSUPPORTED_FIELDS = (
    ("mm_inputs", "multimodal inputs"),
    ("return_hidden_states", "hidden states"),
    ("disaggregated_params", "prefill-decode disaggregation"),
    ("custom_logit_processor", "custom logit processors"),
    ("input_embeds", "input embeddings"),
    ("lora_id", "LoRA adapters"),
    ("token_ids_logprob", "logprobs of chosen token ids"),
    ("data_parallel_rank", "data-parallel ranks (srt serves one; replicas sit behind the router)"),
)
UNSUPPORTED_SAMPLING = (
    ("structural_tag", "structural tags"),
    ("stream_interval", "a per-request stream interval (srt's is --stream-interval)"),
    ("custom_params", "custom sampling parameters"),
)
# Native field names (as `RequestError.param` gives them) → this service's names.
GRPC_FIELDS = {
    "input_ids": "tokenized.input_ids",
    "rid": "request_id",
    "sampling_params.ebnf": "sampling_params.ebnf_grammar",
}


def generate_input(request: Any) -> GenerateReqInput:
    """The `GenerateReqInput` of a `GenerateRequest`; RequestError (naming this service's
    field) for an unsupported field or a missing prompt. Values are checked downstream."""
    for name, feature in UNSUPPORTED_FIELDS:
        if _is_set(request, name):
            raise RequestError(f"{name} is not supported: srt has no {feature}", name)
    if not request.request_id:
        raise RequestError("request_id must not be empty", "request_id")
    if not request.HasField("tokenized"):
        raise RequestError("the request has no tokenized input", "tokenized")
    return GenerateReqInput(
        input_ids=list(request.tokenized.input_ids),
        sampling_params=sampling_params(request),
        rid=request.request_id,
        return_logprob=request.return_logprob,
        top_logprobs_num=request.top_logprobs_num,
        logprob_start_len=request.logprob_start_len if request.return_logprob else -1,
        stream=request.stream,
    )


def sampling_params(request: Any) -> dict[str, Any]:
    """The request's sampling parameters as the native API names them ({}: SGLang's defaults,
    when the request has none)."""
    if not request.HasField("sampling_params"):
        return {}
    p = request.sampling_params
    for name, feature in UNSUPPORTED_SAMPLING:
        if _is_set(p, name):
            raise RequestError(
                f"{name} is not supported: srt has no {feature}", f"sampling_params.{name}"
            )
    out: dict[str, Any] = {
        "temperature": p.temperature,
        "top_p": p.top_p or 1.0,
        "top_k": p.top_k or -1,
        "min_p": p.min_p,
        "frequency_penalty": p.frequency_penalty,
        "presence_penalty": p.presence_penalty,
        "repetition_penalty": p.repetition_penalty or 1.0,
        "max_new_tokens": p.max_new_tokens if p.HasField("max_new_tokens") else None,
        "min_new_tokens": p.min_new_tokens,
        "stop": list(p.stop),
        "stop_token_ids": list(p.stop_token_ids),
        "skip_special_tokens": p.skip_special_tokens,
        "spaces_between_special_tokens": p.spaces_between_special_tokens,
        "ignore_eos": p.ignore_eos,
        "no_stop_trim": p.no_stop_trim,
        "n": p.n or 1,
        "logit_bias": dict(p.logit_bias),
    }
    constraint = p.WhichOneof("constraint")
    if constraint is not None:
        out["ebnf" if constraint == "ebnf_grammar" else constraint] = getattr(p, constraint)
    return out


def grpc_field(param: str | None) -> str | None:
    """A native field name as this service spells it."""
    return None if param is None else GRPC_FIELDS.get(param, param)


def _is_set(message: Any, name: str) -> bool:
    """Whether field `name` of `message` holds anything but its default."""
    if message.DESCRIPTOR.fields_by_name[name].has_presence:  # messages, optionals, oneofs
        return bool(message.HasField(name))
    return bool(getattr(message, name))
