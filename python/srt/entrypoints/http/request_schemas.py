"""JSON Schemas of the request bodies, for `/openapi.json`: what each POST route takes, with the
ranges its parser enforces, so that a client generator or a fuzzer (tests/test_api_fuzz.py) can
build requests that reach the model, and wrong ones that must be refused.

The sampling fields come from `SamplingParams` itself; tests/test_api_fuzz.py checks that every
other field the parsers know (`GenerateReqInput`'s, the OpenAI field sets) is described here.
The ranges mirror the parsers' checks. `model`, token ids and token counts are narrowed to the
served model once it is loaded.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from srt.entrypoints.http.openai_messages import CHAT_ROLES
from srt.entrypoints.http.openai_protocol import (
    HARMLESS_CHAT_FIELDS,
    MAX_LOGIT_BIAS,
    SAMPLING_FIELDS,
)
from srt.entrypoints.http.sglang_fields import (
    CHAT_DEFAULTS,
    COMPLETION_DEFAULTS,
    GENERATE_DEFAULTS,
    default_schemas,
)
from srt.request_limits import RequestLimits
from srt.sampling_params import SamplingParams

Schema = dict[str, Any]

INT64_MAX = 2**63 - 1
BOOLEAN: Schema = {"type": "boolean"}
STRING: Schema = {"type": "string"}
NON_EMPTY_STRING: Schema = {"type": "string", "minLength": 1}


@dataclasses.dataclass(frozen=True)
class ModelLimits:
    """What narrows the schemas: the operator's request limits, and the served model's sizes
    (None while it is not loaded)."""

    model_name: str
    requests: RequestLimits
    vocab_size: int | None = None
    context_length: int | None = None


def _per_prompt(item: Schema, limits: ModelLimits) -> Schema:
    """A non-empty list of `item`, one per prompt of a batch."""
    most = limits.requests.max_client_batch_size
    return {"type": "array", "items": item, "minItems": 1, "maxItems": most}


def _one_or_list(item: Schema, limits: ModelLimits) -> Schema:
    """`item`, or one per prompt (the native API's per-prompt fields)."""
    return {"anyOf": [item, _per_prompt(item, limits)]}


def _top_logprobs(limits: ModelLimits, *, nullable: bool = False) -> Schema:
    kind = ["integer", "null"] if nullable else "integer"
    return {"type": kind, "minimum": 0, "maximum": limits.requests.max_logprobs}


def _token_id(limits: ModelLimits) -> Schema:
    schema: Schema = {"type": "integer", "minimum": 0}
    if limits.vocab_size is not None:
        schema["maximum"] = limits.vocab_size - 1
    return schema


def _token_count(limits: ModelLimits) -> Schema:
    schema: Schema = {"type": ["integer", "null"], "minimum": 0}
    if limits.context_length is not None:
        schema["maximum"] = limits.context_length
    return schema


# ---- sampling parameters ------------------------------------------------------------------

# The ranges SamplingParams.__post_init__ (and the seed and logit_bias checks) enforce.
SAMPLING_RANGES: dict[str, Schema] = {
    "max_new_tokens": {"minimum": 0},
    "min_new_tokens": {"minimum": 0},
    "temperature": {"minimum": 0},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"anyOf": [{"const": -1}, {"minimum": 1, "maximum": INT64_MAX}]},
    "min_p": {"minimum": 0, "maximum": 1},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2},
    "n": {"minimum": 1},
    "seed": {"minimum": 0, "maximum": INT64_MAX},
}


def _sampling_value(name: str, hint: Any, limits: ModelLimits) -> Schema:
    """The schema of one sampling field, from its `SamplingParams` type and its range."""
    by_type: dict[Any, Schema] = {
        int: {"type": "integer"},
        float: {"type": "number"},
        bool: BOOLEAN,
        int | None: {"type": ["integer", "null"]},
        # A grammar: JSON Schema text (or the schema itself), a regex or an EBNF grammar.
        str | None: {"type": ["string", "object", "boolean", "null"]}
        if name == "json_schema"
        else {"type": ["string", "null"]},
        tuple[str, ...]: {
            "anyOf": [NON_EMPTY_STRING, {"type": "array", "items": NON_EMPTY_STRING}]
        },
        tuple[int, ...]: {"type": "array", "items": {"type": "integer", "minimum": 0}},
        tuple[tuple[int, float], ...]: {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        },
    }
    schema = {**by_type[hint], **SAMPLING_RANGES.get(name, {})}
    requests = limits.requests
    if name == "max_new_tokens":
        schema = _token_count(limits)
    elif name == "n":
        schema["maximum"] = requests.max_n
    elif name == "stop":
        one = {**NON_EMPTY_STRING, "maxLength": requests.max_stop_sequence_length}
        many = {"type": "array", "items": one, "maxItems": requests.max_stop_sequences}
        schema = {"anyOf": [one, many]}
    elif name == "stop_token_ids":
        schema = {
            "type": "array",
            "items": _token_id(limits),
            "maxItems": requests.max_stop_sequences,
        }
    elif name == "logit_bias":
        schema["maxProperties"] = requests.max_logit_bias_entries
    return schema


def sampling_params_schema(limits: ModelLimits) -> Schema:
    """The native `sampling_params` object: every `SamplingParams` field, nothing else."""
    hints = typing.get_type_hints(SamplingParams)
    return {
        "type": "object",
        "properties": {name: _sampling_value(name, hint, limits) for name, hint in hints.items()},
        "additionalProperties": False,
    }


# ---- the native API ------------------------------------------------------------------------


def generate_schema(limits: ModelLimits) -> Schema:
    """`/generate`: SGLang's `GenerateReqInput`, one prompt or a batch."""
    ids = {"type": "array", "items": _token_id(limits), "minItems": 1}
    properties: dict[str, Schema] = {
        "text": _one_or_list(NON_EMPTY_STRING, limits),
        "input_ids": _one_or_list(ids, limits),
        "sampling_params": _one_or_list(sampling_params_schema(limits), limits),
        "rid": _one_or_list(NON_EMPTY_STRING, limits),
        "return_logprob": _one_or_list(BOOLEAN, limits),
        "top_logprobs_num": _one_or_list(_top_logprobs(limits), limits),
        "stream": BOOLEAN,
        "logprob_start_len": _one_or_list({"type": "integer", "minimum": -1}, limits),
        **default_schemas(GENERATE_DEFAULTS),
    }
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}],
    }


def tokenize_schema(limits: ModelLimits) -> Schema:
    return {
        "type": "object",
        "properties": {
            "prompt": {"anyOf": [STRING, _per_prompt(STRING, limits)]},
            "add_special_tokens": BOOLEAN,
        },
        "required": ["prompt"],
    }


ABORT_REQUEST: Schema = {
    "type": "object",
    "properties": {"rid": STRING, "abort_all": BOOLEAN},
}


def detokenize_schema(limits: ModelLimits) -> Schema:
    ids = {"type": "array", "items": _token_id(limits)}
    return {
        "type": "object",
        "properties": {
            "tokens": {"anyOf": [ids, _per_prompt(ids, limits)]},
            "skip_special_tokens": BOOLEAN,
        },
        "required": ["tokens"],
    }


# ---- the OpenAI API ------------------------------------------------------------------------


def _openai_sampling(limits: ModelLimits) -> dict[str, Schema]:
    """The sampling fields both OpenAI routes take (OpenAI's names), null meaning unset."""
    hints = typing.get_type_hints(SamplingParams)
    out = {}
    for field, name in SAMPLING_FIELDS.items():
        schema = _sampling_value(name, hints[name], limits)
        out[field] = {"anyOf": [schema, {"type": "null"}]}
    return out


# OpenAI's `response_format` (openai_protocol.response_format_schema).
RESPONSE_FORMAT: Schema = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": ["text", "json_object"]}},
            "required": ["type"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {
                    "type": "object",
                    "properties": {
                        "name": STRING,
                        "description": STRING,
                        "schema": {"type": ["object", "boolean"]},
                        "strict": {"type": ["boolean", "null"]},
                    },
                    "required": ["name"],
                },
            },
            "required": ["type", "json_schema"],
        },
        {"type": "null"},
    ]
}


def _openai_common(limits: ModelLimits) -> dict[str, Schema]:
    return {
        "model": {"type": "string", "enum": [limits.model_name]},
        "n": {"type": ["integer", "null"], "minimum": 1, "maximum": limits.requests.max_n},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": BOOLEAN},
            "additionalProperties": False,
        },
        "max_tokens": _token_count(limits),
        "user": {"type": ["string", "null"]},
        "response_format": RESPONSE_FORMAT,
        **_openai_sampling(limits),
    }


def completion_schema(limits: ModelLimits) -> Schema:
    """`/v1/completions`."""
    ids = {"type": "array", "items": _token_id(limits), "minItems": 1}
    prompt = {
        "anyOf": [
            NON_EMPTY_STRING,
            _per_prompt(NON_EMPTY_STRING, limits),
            ids,
            _per_prompt(ids, limits),
        ]
    }
    properties = {
        **_openai_common(limits),
        "prompt": prompt,
        "logprobs": _top_logprobs(limits, nullable=True),
        "echo": {"type": ["boolean", "null"]},
        "best_of": {"type": ["integer", "null"], "minimum": 1, "maximum": limits.requests.max_n},
        "suffix": {"type": ["string", "null"], "maxLength": 0},
        **default_schemas(COMPLETION_DEFAULTS),
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["model", "prompt"],
        "additionalProperties": False,
    }


FUNCTION: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]},
        "strict": {"type": ["boolean", "null"]},
    },
    "required": ["name"],
    "additionalProperties": False,
}
TOOL: Schema = {
    "type": "object",
    "properties": {"type": {"const": "function"}, "function": FUNCTION},
    "required": ["type", "function"],
    "additionalProperties": False,
}
TOOL_CALL: Schema = {
    "type": "object",
    "properties": {
        "id": STRING,
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {"name": STRING, "arguments": STRING},
            "required": ["name", "arguments"],
        },
    },
    "required": ["id", "type", "function"],
}
NAMED_TOOL_CHOICE: Schema = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "properties": {"name": STRING}, "required": ["name"]},
    },
    "required": ["type", "function"],
}


def chat_schema(limits: ModelLimits) -> Schema:
    """`/v1/chat/completions`: text messages (tool calls and results among them), text or tool
    call answers."""
    text_part = {
        "type": "object",
        "properties": {"type": {"const": "text"}, "text": STRING},
        "required": ["type", "text"],
    }
    message = {
        "type": "object",
        "properties": {
            "role": {"enum": list(CHAT_ROLES)},
            "content": {"anyOf": [STRING, {"type": "array", "items": text_part}, {"type": "null"}]},
            "name": {"type": ["string", "null"]},
            "refusal": {"type": ["string", "null"]},
            "tool_calls": {"type": ["array", "null"], "items": TOOL_CALL},
            "tool_call_id": {"type": ["string", "null"]},
        },
        "required": ["role", "content"],
        "additionalProperties": False,
    }
    properties = {
        **_openai_common(limits),
        "messages": {"type": "array", "items": message, "minItems": 1},
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": _top_logprobs(limits, nullable=True),
        "max_completion_tokens": _token_count(limits),
        "tools": {"type": ["array", "null"], "items": TOOL, "minItems": 1},
        "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required", None]}, NAMED_TOOL_CHOICE]},
        "parallel_tool_calls": {"type": ["boolean", "null"]},
        # Accepted only when they ask for plain text (openai_protocol.check_chat_extras).
        "functions": {"type": ["array", "null"], "maxItems": 0},
        "function_call": {"enum": ["none", "auto", None]},
        "modalities": {"anyOf": [{"const": ["text"]}, {"type": "null"}]},
        "audio": {"type": "null"},
        "web_search_options": {"type": "null"},
        **{name: {} for name in HARMLESS_CHAT_FIELDS},
        **default_schemas(CHAT_DEFAULTS),
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["model", "messages"],
        "additionalProperties": False,
    }


def request_bodies(limits: ModelLimits) -> dict[str, Schema | None]:
    """The body schema of every POST route, by path; None: the route takes no body."""
    return {
        "/generate": generate_schema(limits),
        "/v1/completions": completion_schema(limits),
        "/v1/chat/completions": chat_schema(limits),
        "/tokenize": tokenize_schema(limits),
        "/detokenize": detokenize_schema(limits),
        "/abort_request": ABORT_REQUEST,
        "/flush_cache": None,
    }
